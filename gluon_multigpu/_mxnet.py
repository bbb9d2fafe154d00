"""MXNet, loaded with the book's NumPy semantics (``npx.set_np()``).

Every module of the package that uses MXNet imports this one first, so that
whichever of them a program reaches first turns the semantics on, as the
book does at the top of each section. Before it loads, ``run.engine`` records
the engine variables MXNet loads with (it reads ``OMP_NUM_THREADS`` once).
"""
from .run import engine as _engine

_engine.note_loading()

# pylint: disable=wrong-import-position
import mxnet  # noqa: E402,F401
from mxnet import npx  # noqa: E402

npx.set_np()

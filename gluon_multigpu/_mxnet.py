"""MXNet, loaded with the book's NumPy semantics (``npx.set_np()``).

Every module of the package that uses MXNet imports this one first, so that
whichever of them a program reaches first turns the semantics on, as the
book does at the top of each section. Before MXNet loads, ``base.engine``
checks the engine variables (a value MXNet cannot take, such as
``OMP_NUM_THREADS=abc``, is an ``EngineError`` here instead of an abort of
the process) and records the ones MXNet loads with (``engine.settings()``).
If other code loaded MXNet first, only the semantics are turned on.
"""
from .base import engine as _engine

if not _engine.loaded():
    _engine.check_environment()
    _engine.note_loading()

# pylint: disable=wrong-import-position
import mxnet  # noqa: E402,F401
from mxnet import npx  # noqa: E402

npx.set_np()

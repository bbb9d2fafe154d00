"""MXNet, loaded with the book's NumPy semantics (``npx.set_np()``).

Every module of the package that uses MXNet imports this one first, so that
whichever of them a program reaches first turns the semantics on, as the
book does at the top of each section. Before MXNet loads, ``base.engine``
checks the engine variables (a value MXNet cannot take, such as
``OMP_NUM_THREADS=abc``, is an ``EngineError`` here instead of an abort of
the process) and records the ones MXNet loads with (``engine.settings()``),
and ``base.compat`` makes MXNet 1.9.1 loadable on today's NumPy and Python;
an MXNet that still cannot load is an ``MXNetLoadError`` saying what to
install. If other code loaded MXNet first, only the semantics and the
after-load part of ``base.compat`` are applied.
"""
from .base import compat as _compat, engine as _engine
from .errors import MXNetLoadError

if not _engine.loaded():
    _engine.check_environment()
    _engine.note_loading()
    _compat.prepare()

# pylint: disable=wrong-import-position
try:
    with _compat.root_logging_kept():
        import mxnet  # noqa: E402
except MXNetLoadError:  # said already (base.compat's finder)
    raise
except Exception as _error:  # its library missing (RuntimeError), a NumPy it cannot run on...
    raise MXNetLoadError(_compat.load_advice(_error)) from _error

_compat.after_load(mxnet)
with _compat.root_logging_kept():  # the first set_np logs (logging.info): no handler left for it
    mxnet.npx.set_np()

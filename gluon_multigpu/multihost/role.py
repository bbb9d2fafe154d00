"""A scheduler or server of a launched job (``plan.ROLE``): MXNet runs the role as it loads (the
DMLC_* variables say which), once the package has prepared NumPy for it (``base.compat``),
then the process exits. An MXNet that cannot load is one line saying what to do, status 2."""
import sys

from ..base import compat
from ..errors import MXNetLoadError

__all__ = ['main']


def main():
    """Load MXNet, which runs the role; an MXNet that cannot load: one line, exit status 2."""
    try:
        import mxnet  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except MXNetLoadError as e:  # base.compat's finder said what to do
        why = str(e)
    except ImportError as e:  # not installed, or a module of it missing
        why = compat.load_advice(e)
    else:
        return
    print(f'error: {why}', file=sys.stderr, flush=True)
    sys.exit(2)

"""MXNet 1.9.1 on today's NumPy (1.17 to 2.x) and on a Python without ``distutils``.

MXNet 1.9.1 was released for NumPy below 1.24 and a Python with ``distutils``: it reads at
import NumPy names that NumPy later removed, and passes each operator parameter to its C
library as ``str()`` of the value, which NumPy 2 writes as ``np.int64(4)``. This module is
the one place that makes it work anyway; NumPy's print options, error settings and default
types are left as they are. What it changes is listed below.

Notes
-----
1. ``prepare()``, before MXNet loads: names NumPy removed, set again on ``numpy`` where NumPy
   lacks them (nothing present is replaced; a name NumPy still serves with a deprecation
   warning is kept): the builtin aliases ``bool int float complex object str unicode long``;
   from NumPy 2.0's table of expired names ``Inf Infinity infty PINF NINF NaN PZERO NZERO
   float_ complex_ cfloat singlecomplex longfloat clongfloat longcomplex string_ unicode_
   round_ alltrue sometrue mat asfarray``; ``NAN msort in1d trapz product cumproduct
   row_stack`` (as their NumPy 2 equivalents) and ``fv ipmt irr mirr nper npv pmt ppmt pv
   rate`` (stand-ins that raise, naming numpy-financial). Also ``distutils.version``
   (``LooseVersion``, ``StrictVersion``) for MXNet's import: where a real ``distutils``
   exists, importing it costs setuptools' import, so the stand-ins serve MXNet's import and
   ``after_load`` withdraws them; where none exists (Python 3.12 and newer without
   setuptools) they stay.
2. ``after_load(mxnet)``, on NumPy 2 only: MXNet's imperative invoke and symbol creator,
   which every operator call goes through, get NumPy scalars (alone or in a list or tuple)
   as the equal Python numbers, so no call site can hand MXNet a NumPy 2 scalar.
3. ``after_load(mxnet)``, on every NumPy: the name ``print`` of ``mxnet.symbol.symbol``
   (whose failing shape and type inference prints its arguments before it raises) prints as
   before, except in a thread inside ``quiet()``, where it prints nothing (swapping
   ``sys.stdout`` instead could be left swapped by two trainings in two threads).
4. ``install_hook()`` (importing ``gluon_multigpu`` calls it): the process's first ``import
   mxnet`` from anywhere gets 1 to 3 (tests, notebooks and the parameter server's roles
   import MXNet themselves), and a library MXNet cannot load becomes ``MXNetLoadError``
   saying what to install.
"""
import builtins
import importlib.machinery
import os
import re
import contextlib
import functools
import operator
import sys
import threading
import traceback
import types
import warnings

from ..errors import MXNetLoadError
from . import opcache

__all__ = ['prepare', 'after_load', 'report', 'numpy_version', 'KNOWN_NUMPY', 'numpy_is_known',
           'install_hook', 'load_advice', 'failing_package', 'GPU_INSTALL', 'quiet',
           'root_logging_kept']

#: The one way to install MXNet's GPU build, written once: every message and doc gives it whole.
#: The extra adds mxnet-cu112, which writes the same ``mxnet`` module as the CPU build the package
#: requires; the second command makes the GPU build's files the ones in place.
GPU_INSTALL = "pip install -e '.[cu112]' && pip install --force-reinstall --no-deps mxnet-cu112==1.9.1"
#: MXNet's CPU build put in place of whatever build is there, as the messages below give it.
CPU_INSTALL = 'pip install --force-reinstall --no-deps mxnet==1.9.1'
#: MXNet where none is installed (on NumPy 2 without its requirements: it asks for NumPy 1).
MXNET_INSTALL = 'pip install mxnet==1.9.1 (on NumPy 2: pip install --no-deps mxnet==1.9.1)'

#: The NumPy releases this module was run against (the runtime matrix of ``tools/runtimes.py``):
#: (oldest, newest) as (major, minor). A newer one may work; the doctor says it is untried.
KNOWN_NUMPY = ((1, 17), (2, 5))

#: The ``distutils`` stand-ins of ``provide_distutils_version``, and whether to withdraw them.
_STAND_IN = {}
_DONE = {'prepared': False, 'numpy_names': [], 'distutils': False, 'plain_values': False,
         'quiet_prints': False}
#: Per thread: whether MXNet's diagnostic prints are dropped (inside ``quiet()``).
_QUIET = threading.local()


def _replacements(numpy):
    """name -> value for every removed name this module restores (made from NumPy itself)."""
    def removed(name):
        def stand_in(*args, **kwargs):
            raise NotImplementedError(f'numpy.{name} was removed from NumPy in version 1.20: '
                                      f'install numpy-financial and use numpy_financial.{name}')
        stand_in.__name__ = name
        return stand_in

    def msort(a):
        return numpy.sort(a, axis=0)

    def in1d(ar1, ar2, assume_unique=False, invert=False):
        return numpy.isin(numpy.asarray(ar1).ravel(), ar2, assume_unique=assume_unique,
                          invert=invert)

    def asfarray(a, dtype=numpy.float64):
        dtype = numpy.dtype(dtype)
        return numpy.asarray(a, dtype=dtype if dtype.kind in 'fc' else numpy.float64)

    renamed = (('trapz', 'trapezoid'), ('product', 'prod'), ('cumproduct', 'cumprod'),
               ('row_stack', 'vstack'), ('round_', 'round'), ('alltrue', 'all'),
               ('sometrue', 'any'), ('mat', 'asmatrix'))
    return {'bool': bool, 'int': int, 'float': float, 'complex': complex, 'object': object,
            'str': str, 'unicode': str, 'long': int, 'Inf': numpy.inf, 'Infinity': numpy.inf,
            'infty': numpy.inf, 'PINF': numpy.inf, 'NINF': -numpy.inf, 'NaN': numpy.nan,
            'NAN': numpy.nan, 'PZERO': 0.0, 'NZERO': -0.0, 'float_': numpy.float64,
            'complex_': numpy.complex128, 'cfloat': numpy.complex128,
            'singlecomplex': numpy.complex64, 'longfloat': numpy.longdouble,
            'clongfloat': numpy.clongdouble, 'longcomplex': numpy.clongdouble,
            'string_': numpy.bytes_, 'unicode_': numpy.str_, 'msort': msort, 'in1d': in1d,
            'asfarray': asfarray,
            **{name: vars(numpy)[new] for name, new in renamed if new in vars(numpy)},
            # the financial functions NumPy 1.20 removed and MXNet's fallback table still reads
            **{n: removed(n) for n in 'fv ipmt irr mirr nper npv pmt ppmt pv rate'.split()}}


def _has(module, name):
    """Whether ``module.name`` gives a value (a deprecated name that still works counts)."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return hasattr(module, name)


def restore_numpy_names(numpy):
    """Set each removed name of ``_replacements`` that ``numpy`` lacks; return those set."""
    table = _replacements(numpy)
    restored = [name for name in table if not _has(numpy, name)]
    for name in restored:
        setattr(numpy, name, table[name])
    return restored


def _numeric(text):
    if (match := re.match(r'\s*v?(\d+(?:\.\d+)*)', str(text))) is None:
        raise ValueError(f'invalid version number {text!r}')
    return tuple(int(part) for part in match.group(1).split('.'))


@functools.total_ordering
class _Version:
    """A version compared by its leading numbers (``'2.4.6'`` > ``'1.17'``; ``'1.26.0rc1'`` as 1.26.0)."""

    def __init__(self, vstring=None):
        self.vstring, self.version = vstring, _numeric(vstring) if vstring is not None else ()

    def _key(self, other):  # both padded with zeros to the same length (the two lengths' sum)
        other = other if isinstance(other, _Version) else type(self)(other)
        return self.version + (0,) * len(other.version), other.version + (0,) * len(self.version)

    def __eq__(self, other):
        return operator.eq(*self._key(other))

    def __lt__(self, other):
        return operator.lt(*self._key(other))

    def __str__(self):
        return str(self.vstring)

    def __repr__(self):
        return f'{type(self).__name__}({self.vstring!r})'


class LooseVersion(_Version):
    """``distutils.version.LooseVersion``, as far as MXNet uses it."""


class StrictVersion(_Version):
    """``distutils.version.StrictVersion``, as far as MXNet uses it."""


def _real_distutils():
    """Whether ``import distutils`` would find a real one: the standard library's (Python 3.11
    and older) or setuptools' (its ``_distutils_hack``); found without importing it."""
    if 'distutils' in sys.modules:
        return sys.modules['distutils'] is not None  # None: the import is blocked
    hack = any(type(f).__name__ == 'DistutilsMetaFinder' for f in sys.meta_path)
    return (importlib.machinery.PathFinder.find_spec('distutils') is not None or
            (hack and os.environ.get('SETUPTOOLS_USE_DISTUTILS', 'local') == 'local'))


def provide_distutils_version():
    """Have MXNet's ``import distutils.version`` take this module's classes; return whether.

    Importing the real one costs setuptools' import (a quarter of a second)
    where setuptools provides it: the stand-ins serve MXNet's import, and are
    withdrawn after it (``after_load``) where a real one exists.
    """
    if sys.modules.get('distutils.version') is not None:
        return False
    _STAND_IN['withdraw'] = _real_distutils()
    if sys.modules.get('distutils') is not None:  # a real package, already loaded: cheap
        with contextlib.suppress(ImportError):
            import distutils.version  # noqa: F401  pylint: disable=import-outside-toplevel,deprecated-module
            return False
    _STAND_IN['before'] = {n: sys.modules[n] for n in ('distutils', 'distutils.version')
                           if n in sys.modules}
    if (package := sys.modules.get('distutils')) is None:
        package = types.ModuleType('distutils', 'Stand-in made by gluon_multigpu.base.compat: '
                                                'Python 3.12 removed distutils.')
        package.__path__ = []
        sys.modules['distutils'] = package
    version = types.ModuleType('distutils.version', 'LooseVersion and StrictVersion, for MXNet '
                                                    '(gluon_multigpu.base.compat).')
    version.LooseVersion, version.StrictVersion = LooseVersion, StrictVersion
    sys.modules['distutils.version'] = package.version = version
    _STAND_IN['modules'] = {'distutils': package, 'distutils.version': version}
    return True


def withdraw_distutils_stand_in():
    """Once MXNet has loaded: the stand-ins out of ``sys.modules`` where a real ``distutils``
    exists, so that other code imports that one."""
    ours = _STAND_IN.pop('modules', None)
    if not ours or not _STAND_IN.get('withdraw'):
        return
    before = _STAND_IN.pop('before', {})
    for name, module in ours.items():
        if sys.modules.get(name) is module:
            del sys.modules[name]
            if name in before:
                sys.modules[name] = before[name]


def numpy_version(text=None):
    """(major, minor) of NumPy's version (of ``text`` if given)."""
    if text is None:
        import numpy  # pylint: disable=import-outside-toplevel
        text = numpy.__version__
    return _numeric(text)[:2]


def numpy_pin():
    """The pip requirement of the NumPy releases this module was run against."""
    (low_major, low_minor), (major, minor) = KNOWN_NUMPY
    return f"'numpy>={low_major}.{low_minor},<{major}.{minor + 1}'"


def numpy_is_known(text=None):
    """Whether NumPy's version lies in the range this module was run against."""
    return KNOWN_NUMPY[0] <= numpy_version(text) <= KNOWN_NUMPY[1]


def prepare():
    """What must be in place before ``import mxnet`` (items 1 and 2 of the module's text)."""
    import numpy  # pylint: disable=import-outside-toplevel
    _DONE['numpy_names'] = sorted(set(_DONE['numpy_names']) | set(restore_numpy_names(numpy)))
    _DONE['distutils'] = provide_distutils_version() or _DONE['distutils']
    opcache.install()
    _DONE['prepared'] = True


def plain(value, generic):
    """``value`` with each NumPy scalar (an instance of ``generic``) made the equal Python number,
    also inside a list or tuple; anything else as it is."""
    kind = type(value)
    if kind in (list, tuple) and any(isinstance(v, generic) or type(v) in (list, tuple)
                                     for v in value):
        return kind(plain(v, generic) for v in value)
    return value.item() if isinstance(value, generic) else value


def _plain_values(invoke, generic, index):
    """``invoke`` with the operator parameters it is handed (argument ``index``) made plain."""
    def wrapped(*args, **kwargs):
        return invoke(*args[:index], plain(args[index], generic), *args[index + 1:], **kwargs)
    wrapped.__wrapped__, wrapped.__name__ = invoke, getattr(invoke, '__name__', 'invoke')
    return wrapped


def _quiet_print(*args, **kwargs):
    """``print``, but nothing in a thread inside ``quiet()``."""
    if not getattr(_QUIET, 'on', False):
        builtins.print(*args, **kwargs)


@contextlib.contextmanager
def quiet():
    """In this thread only: MXNet's shape and type inference prints nothing (item 3)."""
    was, _QUIET.on = getattr(_QUIET, 'on', False), True
    try:
        yield
    finally:
        _QUIET.on = was


def after_load(mxnet):
    """What must follow ``import mxnet`` (items 3 and 4 of the module's text); idempotent."""
    import numpy  # pylint: disable=import-outside-toplevel
    opcache.save()
    withdraw_distutils_stand_in()
    if not _DONE['quiet_prints']:
        # The failing inference prints its arguments before it raises; the name ``print`` of
        # that module, not the process's stdout, is what a thread can quieten for itself.
        mxnet.symbol.symbol.print = _quiet_print
        _DONE['quiet_prints'] = True
    if numpy_version() < (2, 0) or _DONE['plain_values']:
        return
    # Every operator of mxnet.nd / mxnet.np (and the internal _npi, _internal...) is made by
    # MXNet's register modules, whose generated code calls these two names in their globals.
    # _imperative_invoke(handle, ndargs, keys, vals, ...), _symbol_creator(handle, args,
    # kwargs, keys, vals, ...): ``vals`` at 3 and 4
    for register, name, index in ((mxnet.ndarray.register, '_imperative_invoke', 3),
                                  (mxnet.symbol.register, '_symbol_creator', 4)):
        setattr(register, name, _plain_values(getattr(register, name), numpy.generic, index))
    _DONE['plain_values'] = True


@contextlib.contextmanager
def root_logging_kept():
    """Within the block, a handler added to the root logger is taken off again at its end:
    MXNet's import and its first ``npx.set_np()`` log with ``logging.info``, which gives a root
    without handlers one (``basicConfig()``), and a user's ``basicConfig`` then did nothing."""
    import logging  # pylint: disable=import-outside-toplevel
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
            handler.close()


def report():
    """What this process changed: whether ``prepare`` ran, the NumPy names restored, whether
    ``distutils.version`` was provided, whether operator parameters are made plain, and the
    operator functions' cache (``opcache.stats``)."""
    return {**_DONE, 'numpy_names': list(_DONE['numpy_names']), 'op_cache': opcache.stats()}


#: A library MXNet's own library needs, named in the loader's message -> what to do.
LIBRARIES = (
    ('libquadmath', 'install the GNU quad-precision library (Debian/Ubuntu: apt-get install '
                    'libquadmath0; Fedora: dnf install libquadmath)'),
    ('libgomp', 'install the GNU OpenMP library (Debian/Ubuntu: apt-get install libgomp1; '
                'Fedora: dnf install libgomp)'),
    ('libgfortran', 'install the GNU Fortran runtime (Debian/Ubuntu: apt-get install '
                    'libgfortran5)'),
    ('libcuda.so', "this is MXNet's CUDA build and no NVIDIA driver is installed: install the "
                   f'driver, or the CPU build: {CPU_INSTALL}'),
    ('libcud', "MXNet's CUDA build (mxnet-cu112) needs CUDA 11.2's libraries (cudart, cublas, "
               f'cudnn) on the library path: install them, or the CPU build: {CPU_INSTALL}'),
    ('libnccl', "MXNet's CUDA build needs NCCL's library (libnccl.so.2) on the library path"))


def failing_package(error):
    """The top-level package whose import ``error`` ended, or None (an ``ImportError``'s module;
    else the code's that raised it while loading: a broken NumPy raises in its ``__init__``)."""
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
    top = ((error.name if isinstance(error, ImportError) else None) or
           (frames[-1].f_globals.get('__name__', '') if frames else '')).split('.')[0]
    return top if top and (isinstance(error, ImportError) or top not in sys.modules) else None


def load_advice(error):
    """One line saying what to install or set, for ``error`` raised by ``import mxnet`` (an
    ``ImportError`` from NumPy, or another package MXNet imports, names that package)."""
    text = f'{type(error).__name__}: {str(error).strip()}'.splitlines()[0].rstrip(': ')
    package = failing_package(error) or 'mxnet'
    if package == 'numpy':
        return f'NumPy cannot be imported ({text}): pip install --force-reinstall {numpy_pin()}'
    if package not in ('mxnet', 'gluon_multigpu', '__main__', ''):
        return f'{package} cannot be imported ({text}): reinstall the package that provides it'
    if isinstance(error, ModuleNotFoundError) and (error.name or '').split('.')[0] == 'mxnet':
        return f'MXNet is not installed in this Python: {MXNET_INSTALL}'
    for library, advice in LIBRARIES:
        if library in str(error):
            return f'MXNet cannot load ({text}): {advice}'
    if isinstance(error, AttributeError) and 'numpy' in str(error).lower():
        import numpy  # pylint: disable=import-outside-toplevel
        return (f'MXNet cannot load on NumPy {numpy.__version__} ({text}): this NumPy is newer '
                f'than the ones gluon-multigpu knows (up to {".".join(map(str, KNOWN_NUMPY[1]))}); '
                f'pip install {numpy_pin()}')
    return (f'MXNet cannot load ({text}): reinstall it ({CPU_INSTALL}) and run '
            'gluon-multigpu-doctor')


def _load_mxnet(execute, module):
    """MXNet's import (``execute``): ``after_load`` once it has run; a failure that is no
    ``ImportError`` becomes ``MXNetLoadError`` saying what to install."""
    try:
        with root_logging_kept():
            execute(module)
    except (ImportError, MXNetLoadError):  # as raised (_mxnet says an ImportError)
        raise
    # Any other failure: a library it needs (OSError), its own library missing
    # (RuntimeError), a NumPy it cannot run on (AttributeError), a half-copied install...
    except Exception as e:  # pylint: disable=broad-except
        raise MXNetLoadError(load_advice(e)) from e
    after_load(module)


def install_hook():
    """At the process's first ``import mxnet``: ``prepare()`` before MXNet's code runs and
    ``after_load`` once it has (``opcache.OnLoad``); nothing once MXNet is loaded."""
    opcache.on_load('mxnet', _load_mxnet, prepare)

"""The engine settings: what MXNet reads once, chosen for the devices a program trains on.

When MXNet reads them (MXNet 1.9.1, measured: ``tests/training/test_engine.py``):

- ``OMP_NUM_THREADS`` as its library loads (``import mxnet``): the OpenMP
  threads of every CPU operator are fixed then.
- ``MXNET_CPU_TEMP_COPY`` once per Python thread, when that thread first
  runs an operator that needs scratch space or random numbers, or seeds
  them (``a + 1``, ``a.sum()`` and ``mx.random.seed`` do; ``import mxnet``,
  ``npx.set_np()``, ``np.ones`` and ``npx.relu`` do not). A value set after
  that is used only by threads that have run no such operator yet.

So the settings must be in the environment before MXNet loads: ``configure``
(which ``gm.cpu_devices(n)`` calls) is the one place they are computed
(``recommended``) and set. This module imports nothing that loads MXNet.

Notes
-----
What ``configure`` sets, unless the user set it (a variable set by the user always wins, and
``GLUON_MULTIGPU_ENGINE_ENV=0`` keeps MXNet's own defaults):

- ``MXNET_CPU_TEMP_COPY``, the CPU scratch copies per Python thread: ``CPU_COPIES`` (one) on
  CPU contexts, each of which queues from a thread of its own (``machinery.pushers``) and runs one
  operator at a time; 64 for GPUs; with synchronised BatchNorm 128 per context, at least 256
  (a layer waiting in its barrier holds a copy: too few, and the contexts wait forever).
- ``OMP_NUM_THREADS`` (CPU contexts only): a worker's cores divided among its contexts. A
  worker's cores are its host's (``HOST_CORES`` where the host has fewer than the machine, a
  host of the namespace lab) divided among the workers the launcher runs there
  (``HOST_WORKERS``): OpenMP threads spin while they wait, and too many on few cores wait for
  each other.
- glibc's allocator (``return_freed_memory``, at any time): blocks of ``MMAP_THRESHOLD``
  bytes or more are mapped and handed back when freed, the heap's top trimmed past
  ``TRIM_THRESHOLD`` only; MXNet allocates and frees every array with ``malloc``, and glibc
  kept the freed blocks in its heap, fragmented. A ``MALLOC_*`` variable set keeps glibc's own.
  A model's recipe may lower the threshold as its network is compiled (``freed_blocks_from``).
"""
import contextlib
import ctypes
import os
import platform
import re
import sys
import warnings

from ..errors import GluonMultiGPUError

__all__ = ['EngineError', 'EngineWarning', 'configure', 'recommended', 'check_environment',
           'cores', 'worker_cores', 'HOST_CORES', 'HOST_WORKERS', 'loaded', 'note_loading',
           'settings', 'return_freed_memory', 'freed_blocks_from', 'caller_stacklevel']

#: Set by the launcher and the namespace lab, not by users (see the module's text): the cores
#: of the host this process runs on, where it has fewer than the machine; the workers of the
#: job that the host runs.
HOST_CORES, HOST_WORKERS = 'GLUON_MULTIGPU_HOST_CORES', 'GLUON_MULTIGPU_HOST_WORKERS'
#: Engine variables checked before MXNet loads: name -> (smallest, largest) whole value.
#: MXNet aborts (OMP_NUM_THREADS=abc: status 134) or dies silently
#: (MXNET_CPU_TEMP_COPY=0: status 136) on values outside these; it parses
#: ASCII digits only (OMP_NUM_THREADS=\u0662, an Arabic-Indic two, aborts).
LIMITS = {'OMP_NUM_THREADS': (1, 1024), 'MXNET_CPU_TEMP_COPY': (1, 4096),
          'MXNET_CPU_WORKER_NTHREADS': (1, 1024), 'MXNET_CPU_PRIORITY_NTHREADS': (1, 1024),
          'MXNET_GPU_WORKER_NTHREADS': (1, 1024), 'MXNET_GPU_COPY_NTHREADS': (1, 1024),
          'MXNET_ENABLE_GPU_P2P': (0, 1), 'MXNET_CUDNN_AUTOTUNE_DEFAULT': (0, 2),
          'MXNET_CPU_PARALLEL_RAND_COPY': (1, 1024), 'MXNET_KVSTORE_USETREE': (0, 1),
          'MXNET_UPDATE_ON_KVSTORE': (0, 1), 'MXNET_OPTIMIZER_AGGREGATION_SIZE': (0, 60),
          'MXNET_ENABLE_CYTHON': (0, 1), 'MXNET_ENFORCE_CYTHON': (0, 1),
          'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN': (0, 2**31 - 1),
          'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD': (0, 2**31 - 1),
          'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD': (0, 2**31 - 1),
          'MXNET_MKLDNN_CACHE_NUM': (-1, 2**31 - 1), 'MXNET_PROFILER_AUTOSTART': (0, 1),
          'MXNET_PROFILER_MODE': (0, 2**31 - 1), HOST_CORES: (1, 65536), HOST_WORKERS: (1, 65536)}
#: Engine variables MXNet reads as booleans: 0, 1, true or false (any case), nothing else
#: (MXNET_EXEC_BULK_EXEC_TRAIN=abc is an MXNetError, MXNET_MKLDNN_ENABLED=abc status 134).
BOOLEANS = ('MXNET_EXEC_BULK_EXEC_TRAIN', 'MXNET_EXEC_BULK_EXEC_INFERENCE',
            'MXNET_EXEC_ENABLE_INPLACE', 'MXNET_ENGINE_INFO', 'MXNET_MKLDNN_ENABLED',
            'MXNET_MKLDNN_DEBUG', 'MXNET_OUTPUT_TUNING_DATA', 'MXNET_SAFE_ACCUMULATION',
            'MXNET_ENFORCE_DETERMINISM', 'MXNET_USE_FUSION')
#: Engine variables that take one of a few words, exactly as written: name -> (words, advice).
CHOICES = {
    'MXNET_ENGINE_TYPE': (('ThreadedEnginePerDevice', 'ThreadedEngine', 'NaiveEngine'),
                          "set it to one of them (MXNet's default is the first) or unset it"),
    'GLUON_MULTIGPU_ENGINE_ENV': (('0', '1'), "set 0 to keep MXNet's own engine settings, or 1 "
                                  "(or unset it) for the package's (docs/guide.md)"),
    'GLUON_MULTIGPU_OP_CACHE': (('0', '1'), "set 0 to turn the cache of MXNet's operator "
                                "functions off, or 1 (or unset it) to keep it on "
                                '(docs/guide.md, "Python and NumPy")')}
#: The variables ``recommended`` chooses.
CHOSEN = ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY')


class EngineError(GluonMultiGPUError):
    """An engine variable with a value MXNet cannot load with, or settings that cannot train."""


class EngineWarning(UserWarning):
    """MXNet is already loaded with other engine settings than the ones asked for."""


#: MXNet's own number of scratch copies (``MXNET_CPU_TEMP_COPY`` unset).
MXNET_COPIES = 4
#: The scratch copies per thread the plan for CPU contexts sets: as fast as MXNet's 4, and
#: 0.87 times the memory on ResNet-18 (tools/levers.py; docs/results.md, "Memory").
CPU_COPIES = 1
#: What OpenMP threads other than the plan's cost (docs/results.md, "Memory").
_OMP_COST = ('Training works, but its operators run on another number of OpenMP threads than '
             'the cores divided among the contexts: one context on MXNet\'s half of two cores '
             'trained ResNet-18 at about half the images/s (0.53 times, measured by '
             'tools/levers.py, docs/results.md "Memory")')
#: glibc's ``mallopt`` parameters, and the values ``configure`` sets: blocks of 4 MiB or more
#: are mapped (and handed back when freed); the heap's top is trimmed past 256 MiB only.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD, TRIM_THRESHOLD = 4 << 20, 256 << 20

#: Why a setting is not applied once MXNet is loaded (see the module's text).
TOO_LATE = {'OMP_NUM_THREADS': 'MXNet fixed its OpenMP threads as it loaded',
            'MXNET_CPU_TEMP_COPY': "MXNet reads it once per thread, at the thread's first "
                                   'operator, which this thread may have run'}
#: This package's directory: a warning points at the first caller outside it.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What this process knows: the variables ``configure`` set (and that still hold them), those
# MXNet loaded with, and the warnings already given.
_STATE = {'applied': {}, 'loaded_with': None, 'warned': set(), 'malloc': None, 'threshold': None}


def cores():
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def worker_cores(environ=None):
    """The cores one worker may use: its host's (``HOST_CORES``, else this process's) divided
    among the workers the host runs (``HOST_WORKERS``), at least one."""
    environ = os.environ if environ is None else environ
    host = int(environ.get(HOST_CORES) or 0) or cores()
    return max(1, host // int(environ.get(HOST_WORKERS) or 1))


def recommended(cpu_devices=None, sync_bn=False, num_cores=None, environ=None):
    """Return the engine variables for ``cpu_devices`` CPU contexts (0 or None: GPUs or unknown)
    of a worker with ``num_cores`` cores (``worker_cores(environ)`` if not given).

    The module's notes say what they are and why.
    """
    num_cores = num_cores or worker_cores(environ)
    # sync_bn's need; else per thread, and each CPU context's passes are queued from a thread of
    # its own: one copy each is as fast as MXNet's 4 and pays for ResNet-18's static_alloc
    env = {'MXNET_CPU_TEMP_COPY': str(max(256, 128 * (cpu_devices or 2)) if sync_bn else
                                      CPU_COPIES if cpu_devices else 64)}
    return dict(env, OMP_NUM_THREADS=str(max(1, num_cores // cpu_devices))) if cpu_devices else env


def check_environment(environ=None):
    """Raise ``EngineError`` naming the first engine variable with a value MXNet cannot use.

    Whole numbers are ASCII digits in their range (spaces around them are
    allowed, as MXNet allows them), booleans 0, 1, true or false, the engine
    type one of MXNet's three, ``GLUON_MULTIGPU_ENGINE_ENV`` 0 or 1. The
    message is one line (the value is quoted as Python writes it).
    """
    environ = os.environ if environ is None else environ
    for name, (low, high) in LIMITS.items():
        # unset: in range; around the number, what MXNet's parser skips: C's isspace, which is
        # ``\s`` of an ASCII pattern (no Unicode spaces)
        number = re.fullmatch(r'\s*(-?[0-9]+)\s*', text := environ.get(name, str(low)), re.ASCII)
        if not number or not low <= int(number[1]) <= high:
            raise EngineError(f'environment variable {name}={text!r} is not a whole number from '
                              f'{low} to {high}; set it so or unset it')
    for name in BOOLEANS:
        if (text := environ.get(name)) is not None and not (
                text.isascii() and text.lower() in ('0', '1', 'true', 'false')):
            raise EngineError(f'environment variable {name}={text!r} is not a boolean; set it to '
                              '0 or 1 (true or false), or unset it')
    for name, (choices, advice) in CHOICES.items():
        if (text := environ.get(name)) is not None and text not in choices:
            raise EngineError(f'environment variable {name}={text!r} is none of '
                              f'{", ".join(choices)}; {advice}')


def loaded():
    """Whether MXNet is loaded in this process (its engine settings are then fixed)."""
    return 'mxnet' in sys.modules


def note_loading():
    """Record the engine variables MXNet loads with (the package calls it just before it loads
    MXNet; if other code loaded MXNet first, the first call records the environment then)."""
    if _STATE['loaded_with'] is None:
        _STATE['loaded_with'] = {k: os.environ.get(k) for k in CHOSEN}


def settings():
    """The engine variables MXNet loaded with, as a dict (None before MXNet loads).

    ``{'OMP_NUM_THREADS': ..., 'MXNET_CPU_TEMP_COPY': ...}``, None for a
    variable that was not set (MXNet's default). Recorded as the package
    loaded MXNet; if other code loaded it first, as the environment held
    them when the package first looked (``configure`` changes nothing once
    MXNet is loaded).
    """
    if not loaded():
        return None
    note_loading()
    return dict(_STATE['loaded_with'])


def _plan_text(cpu_devices, sync_bn):
    plan = (f'{cpu_devices} CPU context{"s" if cpu_devices > 1 else ""}' if cpu_devices else
            'GPUs' if cpu_devices == 0 else 'GPUs (or devices not counted)')
    return plan + (' with synchronised BatchNorm' if sync_bn else '')


def _call_text(cpu_devices, sync_bn):
    if cpu_devices and not sync_bn:
        return f'gm.cpu_devices({cpu_devices})'
    args = ([f'cpu_devices={cpu_devices}'] if cpu_devices is not None else []) + \
        (['sync_bn=True'] if sync_bn else [])
    return f'gm.engine.configure({", ".join(args)})'


def configure(cpu_devices=None, sync_bn=False, environ=None):
    """Set the engine variables for training on ``cpu_devices`` CPU contexts; return those set.

    Call before MXNet loads (``gm.cpu_devices(n)`` calls it for you). A variable already in the
    environment (set by the user) is kept. Called again before MXNet loads, with another plan,
    it replaces only what it set itself and still holds: a variable of the earlier plan that
    the new one does not want is removed. Once MXNet is loaded the environment is left as it
    is (whether this thread has run an operator cannot be told): if the settings MXNet loaded
    with differ from this plan's, one ``EngineWarning`` per plan says which are not applied,
    why, and how to get them (restart, and configure first).

    Parameters
    ----------
    cpu_devices : int, optional
        CPU contexts trained on side by side; 0 or None for GPUs (or not known).
    sync_bn : bool
        Synchronised BatchNorm: more scratch copies.
    environ : dict, optional
        The environment to check and change (None: ``os.environ``). Another mapping is
        treated as a process's environment before MXNet loads, every variable in it the user's.

    Returns
    -------
    dict of str -> str
        The variables set now.

    Raises
    ------
    EngineError
        An engine variable MXNet cannot load with, or synchronised BatchNorm on several
        devices under MXNet's naive engine (its devices would wait for each other forever).
    """
    process = environ is None or environ is os.environ
    environ = os.environ if process else environ
    check_environment(environ)
    if sync_bn and environ.get('MXNET_ENGINE_TYPE') == 'NaiveEngine' and cpu_devices != 1:
        # Each layer waits for every device's statistics, and the naive engine runs one
        # operation at a time: the first step waited forever (and SIGTERM could not end it).
        raise EngineError('`sync_bn` makes the devices wait for each other, which '
                          'MXNET_ENGINE_TYPE=NaiveEngine (one operation at a time) never lets '
                          'finish; unset MXNET_ENGINE_TYPE or drop `sync_bn`')
    keep_mxnet_own = environ.get('GLUON_MULTIGPU_ENGINE_ENV') == '0'
    wanted = {} if keep_mxnet_own else recommended(cpu_devices, sync_bn=sync_bn, environ=environ)
    if process and not keep_mxnet_own:
        return_freed_memory(environ)
    if process and loaded():
        _warn_if_different(wanted, cpu_devices, sync_bn)
        return {}
    mine = _STATE['applied'] if process else {}
    applied = {name: value for name, value in wanted.items()
               if name not in environ or mine.get(name) == environ[name]}
    for name, value in mine.items():  # an earlier plan's, unchanged since, not wanted now
        if name not in wanted and environ.get(name) == value:
            del environ[name]
    environ.update(applied)
    if process:
        _STATE['applied'] = dict(applied)
    return applied


def return_freed_memory(environ=None):
    """Have glibc map blocks of ``MMAP_THRESHOLD`` bytes or more and hand them back when freed,
    and trim its heap past ``TRIM_THRESHOLD`` only (``mallopt``; see the module's text); return
    whether this process's allocator now does.

    Nothing is changed where a ``MALLOC_*`` variable is set (the user's choice of glibc's
    behaviour), or where the C library is not glibc.
    """
    environ = os.environ if environ is None else environ
    if _STATE['malloc'] is None:
        _STATE['malloc'] = False
        if platform.libc_ver()[0] == 'glibc' and not any(k.startswith('MALLOC_') for k in environ):
            with contextlib.suppress(OSError, AttributeError):
                _STATE['malloc'] = ctypes.CDLL(None).mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        freed_blocks_from(MMAP_THRESHOLD)
    return _STATE['malloc']


def freed_blocks_from(threshold):
    """From now on have glibc map blocks of ``threshold`` bytes or more (and hand them back
    when freed), where this process's allocator is the package's (``return_freed_memory`` took
    it; otherwise nothing changes); return whether it is. A recipe's ``mmap_threshold``."""
    if _STATE['malloc'] and _STATE['threshold'] != threshold:
        _STATE['malloc'] = ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, threshold) == 1
        _STATE['threshold'] = threshold
    return bool(_STATE['malloc'])


def caller_stacklevel():
    """``stacklevel`` for ``warnings.warn`` called by our caller: the first frame outside the
    package (the user's line, however deep in the package the warning is given)."""
    frame, level = sys._getframe(1), 1  # pylint: disable=protected-access
    while frame.f_back is not None and \
            os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _enough(name, loaded_with, wanted):
    """Whether MXNet loaded with ``loaded_with`` serves a plan that wants ``wanted``: more
    scratch copies than wanted only cost memory (a GPU run after a CPU plan, one context
    after two), so they are not worth a restart; OpenMP threads unset are MXNet's default,
    half the cores, which may be the plan's."""
    if name == 'OMP_NUM_THREADS' and loaded_with is None:
        return int(wanted) == max(1, cores() // 2)
    return name == 'MXNET_CPU_TEMP_COPY' and int(loaded_with or MXNET_COPIES) >= int(wanted)


def _warn_if_different(wanted, cpu_devices, sync_bn):
    """Warn, once per plan, when MXNet loaded with settings other than ``wanted``.

    A variable the user set before MXNet loaded wins and is not reported;
    one that was unset (MXNet's default) or set by ``configure`` for
    another plan is.
    """
    loaded_with, mine = settings() or {}, _STATE['applied']
    differ = {k: wanted[k] for k in CHOSEN if k in wanted
              and loaded_with.get(k) != wanted[k] and not _enough(k, loaded_with.get(k), wanted[k])
              and (loaded_with.get(k) is None or mine.get(k) == loaded_with.get(k))}
    key = (cpu_devices, sync_bn, tuple(differ.items()))
    if not differ or key in _STATE['warned']:
        return
    _STATE['warned'].add(key)
    had = ', '.join(f'{k}={loaded_with[k]}' if loaded_with.get(k) is not None else f'{k} unset'
                    for k in CHOSEN if k in differ)
    why = ', '.join(f'{k}={v} ({TOO_LATE[k]})' for k, v in differ.items())
    effect = ('Synchronised BatchNorm on several CPU contexts refuses to start with fewer copies'
              if sync_bn and 'MXNET_CPU_TEMP_COPY' in differ else
              _OMP_COST if 'OMP_NUM_THREADS' in differ and cpu_devices else
              'Training works, but may run slower')
    warnings.warn(f'MXNet is already loaded ({had}), so the engine settings for '
                  f'{_plan_text(cpu_devices, sync_bn)} are not applied: {why}. {effect}; for them, '
                  f'restart the kernel (or Python) and call {_call_text(cpu_devices, sync_bn)} '
                  'before anything loads MXNet', EngineWarning, stacklevel=caller_stacklevel())

"""The engine settings: what MXNet reads once, chosen for the devices a program trains on.

MXNet reads ``OMP_NUM_THREADS`` when its library loads, and
``MXNET_CPU_TEMP_COPY`` when its engine first needs scratch space. So the
settings must be in the environment before MXNet is imported. This module
imports neither MXNet nor anything that does: ``configure`` is the one place
the settings are computed, and scripts, tests and notebooks call it (or
``gm.cpu_devices(n)``, which calls it) before MXNet loads::

    import gluon_multigpu as gm
    devices = gm.cpu_devices(2)      # configures the engine for 2 contexts, then loads MXNet

Called once MXNet is loaded with other settings, ``configure`` changes
nothing and says in one warning (``EngineWarning``) what cannot take effect
and how to get it: a new process (restart the kernel) that configures first.

What the settings are, and why (measured on ResNet-18 and the simple CNN,
docs/results.md):

``MXNET_CPU_TEMP_COPY``: copies of the CPU scratch space, 64 (16 per
context beyond 4 contexts). All CPU contexts share one pool of them (4 by
default), and an operator holding a copy blocks every other operator that
drew the same copy: with 4, the backward passes of two contexts ran one
after the other; 64 measured faster than 32. With synchronised BatchNorm,
128 copies per context, at least 256: a layer waiting for the other
contexts holds a copy, and with 32 per context ResNet-18's contexts waited
for each other forever (``features.sync_bn``).

``OMP_NUM_THREADS`` (CPU contexts only): the cores divided among the
contexts. MXNet's own default is half the cores, which leaves one of two
cores idle when a single context trains. All cores for every context
measured about 15% faster on ResNet-18 with two contexts, but MXNet's
OpenMP-threaded OpenBLAS then hung in ``np.dot`` on two contexts at once.

A variable set in the environment by the user always wins, and
``GLUON_MULTIGPU_ENGINE_ENV=0`` keeps MXNet's own defaults.
"""
import os
import re
import sys
import warnings

from ..errors import GluonMultiGPUError

__all__ = ['EngineError', 'EngineWarning', 'configure', 'recommended', 'check_environment',
           'cores', 'loaded', 'settings']

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
          'MXNET_PROFILER_MODE': (0, 2**31 - 1)}
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
                                  "(or unset it) for the package's (docs/guide.md)")}
#: What MXNet's parser skips around a number (C's isspace; not Unicode spaces).
_C_SPACE = ' \t\n\r\v\f'
#: The variables ``recommended`` chooses.
CHOSEN = ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY')


class EngineError(GluonMultiGPUError):
    """An engine variable with a value MXNet cannot load with, or settings that cannot train."""


class EngineWarning(UserWarning):
    """MXNet is already loaded with other engine settings than the ones asked for."""


# What this process knows: the variables this module set, and those MXNet loaded with.
_STATE = {'applied': {}, 'loaded_with': None, 'plan': None}


def cores():
    """The CPU cores this process may run on."""
    if hasattr(os, 'sched_getaffinity'):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def recommended(cpu_devices=None, sync_bn=False, num_cores=None):
    """Return the engine variables for ``cpu_devices`` CPU contexts (0 or None: GPUs or unknown).

    See the module's text for what they are and why.
    """
    num_cores = num_cores or cores()
    copies = max(64, 16 * (cpu_devices or 0))
    if sync_bn:
        copies = max(256, 128 * (cpu_devices or 2))  # as sync_bn.cpu_scratch_needed
    env = {'MXNET_CPU_TEMP_COPY': str(copies)}
    if cpu_devices:
        env['OMP_NUM_THREADS'] = str(max(1, num_cores // cpu_devices))
    return env


def check_environment(environ=None):
    """Raise ``EngineError`` naming the first engine variable with a value MXNet cannot use.

    Whole numbers are ASCII digits in their range (spaces around them are
    allowed, as MXNet allows them), booleans 0, 1, true or false, the engine
    type one of MXNet's three, ``GLUON_MULTIGPU_ENGINE_ENV`` 0 or 1.
    """
    environ = os.environ if environ is None else environ
    for name, (low, high) in LIMITS.items():
        text = environ.get(name)
        if text is None:
            continue
        value = text.strip(_C_SPACE)
        if not re.fullmatch(r'-?[0-9]+', value, re.ASCII) or not low <= int(value) <= high:
            raise EngineError(f'environment variable {name}={text!r} is not a whole number from '
                              f'{low} to {high}; set it so or unset it')
    for name in BOOLEANS:
        text = environ.get(name)
        if text is not None and not (text.isascii() and
                                     text.lower() in ('0', '1', 'true', 'false')):
            raise EngineError(f'environment variable {name}={text!r} is not a boolean; set it to '
                              '0 or 1 (true or false), or unset it')
    for name, (choices, advice) in CHOICES.items():
        text = environ.get(name)
        if text is not None and text not in choices:
            raise EngineError(f'environment variable {name}={text!r} is none of '
                              f'{", ".join(choices)}; {advice}')


def loaded():
    """Whether MXNet is loaded in this process (its engine settings are then fixed)."""
    return 'mxnet' in sys.modules


def note_loading(environ=None):
    """Record the engine variables MXNet loads with (called just before the package loads it)."""
    if _STATE['loaded_with'] is None:
        environ = os.environ if environ is None else environ
        _STATE['loaded_with'] = {k: environ.get(k) for k in CHOSEN}


def settings():
    """The engine variables MXNet loaded with (None before it loads), as a dict."""
    return dict(_STATE['loaded_with']) if loaded() and _STATE['loaded_with'] is not None else None


def _plan_text(cpu_devices):
    if cpu_devices:
        return f'{cpu_devices} CPU context{"s" if cpu_devices > 1 else ""}'
    return 'GPUs'


def configure(cpu_devices=None, sync_bn=False, environ=None):
    """Set the engine variables for training on ``cpu_devices`` CPU contexts; return those set.

    Call before MXNet loads (``gm.cpu_devices(n)`` calls it for you). A
    variable already in the environment (set by the user) is kept; one this
    function set for an earlier plan is replaced. Raises ``EngineError`` for
    an engine variable MXNet cannot load with, and for synchronised
    BatchNorm on several devices under MXNet's naive engine (one operation
    at a time: its devices would wait for each other forever).

    Once MXNet is loaded nothing changes: if its settings differ from this
    plan's, one ``EngineWarning`` says which cannot take effect and how to
    get them. ``GLUON_MULTIGPU_ENGINE_ENV=0`` keeps MXNet's own defaults.

    Parameters
    ----------
    cpu_devices : int, optional
        CPU contexts trained on side by side; 0 or None for GPUs (or not known).
    sync_bn : bool
        Synchronised BatchNorm: more scratch copies.
    environ : dict, optional
        The environment to check and change (``os.environ``).
    """
    environ = os.environ if environ is None else environ
    check_environment(environ)
    if sync_bn and environ.get('MXNET_ENGINE_TYPE') == 'NaiveEngine' and cpu_devices != 1:
        # Each layer waits for every device's statistics, and the naive engine runs one
        # operation at a time: the first step waited forever (and SIGTERM could not end it).
        raise EngineError('`sync_bn` makes the devices wait for each other, which '
                          'MXNET_ENGINE_TYPE=NaiveEngine (one operation at a time) never lets '
                          'finish; unset MXNET_ENGINE_TYPE or drop `sync_bn`')
    if environ.get('GLUON_MULTIGPU_ENGINE_ENV') == '0':
        return {}
    wanted = recommended(cpu_devices, sync_bn=sync_bn)
    if environ is os.environ and loaded():
        _warn_if_different(wanted, cpu_devices)
        return {}
    applied = {}
    for name, value in wanted.items():
        if name not in environ or _STATE['applied'].get(name) == environ.get(name):
            applied[name] = value
    for name, value in _STATE['applied'].items():  # an earlier plan's, not wanted now
        if name not in wanted and environ.get(name) == value:
            del environ[name]
    environ.update(applied)
    if environ is os.environ:
        _STATE['applied'], _STATE['plan'] = dict(applied), (cpu_devices, sync_bn)
    return applied


def _warn_if_different(wanted, cpu_devices):
    """Warn once per plan when MXNet loaded with settings other than ``wanted``."""
    loaded_with = _STATE['loaded_with'] or {k: os.environ.get(k) for k in CHOSEN}
    mine = _STATE['applied']
    differ = [f'{k}={v}' for k, v in wanted.items()
              if loaded_with.get(k) != v and (loaded_with.get(k) is None or k in mine)]
    if not differ:
        return
    had = ', '.join(f'{k}={loaded_with.get(k) or "unset"}' for k in wanted)
    warnings.warn(
        f'MXNet is already loaded ({had}), so the engine settings for {_plan_text(cpu_devices)} '
        f'({", ".join(differ)}) cannot take effect: training works, but may run slower; for them, '
        'restart the kernel (or Python) and create the devices first (gm.cpu_devices(n), or '
        'gm.engine.configure(cpu_devices=n)) before anything that loads MXNet',
        EngineWarning, stacklevel=3)

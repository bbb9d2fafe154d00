"""Engine settings that decide how fast MXNet trains on CPU contexts.

MXNet reads these from the environment: ``OMP_NUM_THREADS`` when its library
loads, ``MXNET_CPU_TEMP_COPY`` when the engine first needs scratch space. So
they must be in ``os.environ`` before ``import mxnet``. This module imports
nothing of MXNet, and importing ``gluon_multigpu`` does not import MXNet
either (its names load on first use). The scripts, which know how many CPU
contexts they train on, call ``apply_engine_env(num_cpu_devices=N)`` first
thing; a library user can do the same::

    from gluon_multigpu import runtime
    runtime.apply_engine_env(num_cpu_devices=2)
    import gluon_multigpu as gm          # MXNet is imported with the settings in place

Otherwise the package applies the settings that do not depend on the number
of contexts when it first imports MXNet. A variable that is already set is
never changed, so your own value always wins; ``GLUON_MULTIGPU_ENGINE_ENV=0``
leaves the environment alone altogether (MXNet's own defaults: the
benchmark's "book" variant runs so).
"""
import os
import sys

__all__ = ['engine_env', 'apply_engine_env', 'mxnet_imported']


def _cores():
    if hasattr(os, 'sched_getaffinity'):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def engine_env(num_cpu_devices=None, cores=None):
    """Return the recommended engine variables.

    Parameters
    ----------
    num_cpu_devices : int, optional
        How many CPU contexts will train side by side; unknown when None.
    cores : int, optional
        CPU cores to share out; defaults to those this process may run on.

    Returns
    -------
    dict of str to str
        ``MXNET_CPU_TEMP_COPY``: copies of the CPU scratch space, 64 (16 per
        context beyond 4 contexts). All CPU contexts share one pool of them
        (4 by default), and an operator holding a copy blocks every other
        operator that drew the same copy: with 4, the backward passes of two
        contexts ran one after the other; 64 measured faster than 32.
        ``OMP_NUM_THREADS`` (only when ``num_cpu_devices`` is given): the cores
        divided among the contexts. MXNet's own default is half the cores,
        which leaves one of two cores idle when a single context trains. All
        cores for every context measured about 15% faster on ResNet-18 with
        two contexts, but is not the default: MXNet's OpenBLAS is threaded
        with OpenMP, and ``np.dot`` on two contexts at once then hung. Set
        ``OMP_NUM_THREADS`` yourself if your model makes no OpenBLAS calls.
    """
    cores = cores or _cores()
    env = {'MXNET_CPU_TEMP_COPY': str(max(64, 16 * (num_cpu_devices or 0)))}
    if num_cpu_devices is None:
        return env
    if num_cpu_devices > 0:
        env['OMP_NUM_THREADS'] = str(max(1, cores // num_cpu_devices))
    return env


def mxnet_imported():
    """Return True if MXNet is already imported (then ``OMP_NUM_THREADS`` no longer applies)."""
    return 'mxnet' in sys.modules


def apply_engine_env(num_cpu_devices=None, environ=None, cores=None):
    """Put ``engine_env(...)`` into ``environ`` (default ``os.environ``) where not already set.

    Returns
    -------
    dict
        The variables set now (those already set are left out; nothing when
        ``GLUON_MULTIGPU_ENGINE_ENV`` is ``0``).
    """
    environ = os.environ if environ is None else environ
    if environ.get('GLUON_MULTIGPU_ENGINE_ENV') == '0':
        return {}
    applied = {k: v for k, v in engine_env(num_cpu_devices, cores).items() if k not in environ}
    environ.update(applied)
    return applied

"""Device lists, and putting a batch of data onto them (d2l 13.5/13.6).

Devices are always an explicit list named ``devices``: GPUs such as
``[mx.gpu(0), mx.gpu(1)]``, or CPU contexts ``[mx.cpu(0), mx.cpu(1)]``, which
MXNet schedules on separate worker threads, so the same data-parallel code
runs without a GPU.

This module loads MXNet only when a function needs it: ``cpu_devices(n)``
and ``gpu_devices(n)`` first configure MXNet's engine for the devices
(``base.engine``), which must happen before MXNet loads.
"""
import contextlib
import functools
import itertools
import math
import os

from ..errors import DeviceError
from ..base import engine

__all__ = ['num_gpus', 'check_devices', 'try_gpu', 'try_all_gpus', 'cpu_devices', 'gpu_devices',
           'resolve_devices', 'split_sizes', 'split_batch', 'even_shares', 'available_memory']


def _mx():
    """MXNet, loaded now if it was not (with the book's NumPy semantics)."""
    from .. import _mxnet  # noqa: F401  pylint: disable=import-outside-toplevel
    import mxnet  # pylint: disable=import-outside-toplevel
    return mxnet


def num_gpus():
    """Return the number of GPUs MXNet can see (0 on a CPU build)."""
    mx = _mx()
    with contextlib.suppress(mx.base.MXNetError):  # a CUDA build on a machine without a driver
        return mx.npx.num_gpus()
    return 0


def check_devices(devices):
    """Return ``devices`` as a list; raise ``DeviceError`` unless MXNet can train on them.

    A list of distinct contexts, CPUs or GPUs that exist (``cpu_devices(n)``,
    ``gpu_devices(n)``); a single context or a string is refused.
    """
    mx = _mx()
    if isinstance(devices, (str, bytes, mx.Context)):
        raise DeviceError(f'devices must be a list of contexts such as [mx.cpu(0), mx.cpu(1)], '
                          f'got {devices!r}; use gm.cpu_devices(n) or gm.gpu_devices(n)')
    devices = list(devices) if devices is not None else []
    if not devices:
        raise DeviceError('the device list is empty; pass at least one device')
    gpus = functools.cache(num_gpus)  # asked at the first GPU, once
    for device in devices:
        if not isinstance(device, mx.Context) or device.device_type not in ('cpu', 'gpu'):
            raise DeviceError(f'{device!r} is not a device: give contexts such as mx.cpu(0) or '
                              'mx.gpu(0) (gm.cpu_devices(n), gm.gpu_devices(n))')
        if device.device_type == 'gpu' and device.device_id >= gpus():
            have = f'{gpus()} GPU(s) exist' if gpus() else 'no GPU exists (or MXNet is a CPU build)'
            raise DeviceError(f'device {device} is not available: {have}; use '
                              'gm.gpu_devices(n) or gm.cpu_devices(n)')
    if (repeated := next((d for i, d in enumerate(devices) if d in devices[:i]), None)) is not None:
        raise DeviceError(f'device {repeated} is listed twice in {devices}; give each device once')
    return devices


def _configure_for_gpus_or_cpu():
    """Before MXNet loads: the engine for GPUs, or for one CPU context on a machine without any.

    Without an NVIDIA device node MXNet finds no GPU either (the scripts decide the same way).
    """
    if not engine.loaded():
        engine.configure(cpu_devices=None if os.path.exists('/dev/nvidiactl') else 1)


def try_gpu(i=0):
    """Return ``gpu(i)`` if it exists, otherwise ``cpu()``.

    Before MXNet loads, the engine is configured for the GPUs, or for one CPU
    context (all its cores) on a machine without any.
    """
    _configure_for_gpus_or_cpu()
    return _mx().gpu(i) if num_gpus() >= i + 1 else _mx().cpu()


def try_all_gpus():
    """Return all available GPUs, or ``[cpu()]`` if there is no GPU.

    Before MXNet loads, the engine is configured as for ``try_gpu``.
    """
    _configure_for_gpus_or_cpu()
    return [_mx().gpu(i) for i in range(num_gpus())] or [_mx().cpu()]


def cpu_devices(n):
    """Return ``n`` CPU contexts ``[cpu(0), ..., cpu(n-1)]``.

    Before MXNet loads, the engine is configured for ``n`` contexts
    (``engine.configure``: OpenMP threads per context); once
    it is loaded with other settings, an ``engine.EngineWarning`` says so.

    Parameters
    ----------
    n : int
        Number of contexts, at least 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DeviceError(f'the number of CPU devices must be a positive integer, got {n!r}')
    engine.configure(cpu_devices=n)
    return [_mx().cpu(i) for i in range(n)]


def gpu_devices(n):
    """Return ``[gpu(0), ..., gpu(n-1)]``, or raise DeviceError if fewer GPUs exist.

    Parameters
    ----------
    n : int
        Number of GPUs wanted, at least 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DeviceError(f'the number of GPUs must be a positive integer, got {n!r}')
    engine.configure(cpu_devices=None)
    if n > (available := num_gpus()):
        have = (f'only {available} available; ask for at most {available}' if available
                else 'none is available (no GPU, or a CPU build of MXNet)')
        raise DeviceError(f'{n} GPU(s) requested but {have}, or use `cpu_devices` {n} '
                          'to run the same code on CPU contexts')
    return [_mx().gpu(i) for i in range(n)]


def resolve_devices(num_gpus_wanted=None, cpu_devices_wanted=None):
    """Return ``(devices, note)``: the devices asked for, or all GPUs, or the CPU.

    ``note`` says what was chosen when nothing was asked for and no GPU exists.
    """
    if cpu_devices_wanted is not None:
        return cpu_devices(cpu_devices_wanted), None
    if num_gpus_wanted is not None:
        return gpu_devices(num_gpus_wanted), None
    devices = try_all_gpus()
    return devices, ('no GPU found: training on the CPU; use `cpu_devices` N to split each batch '
                     'across N CPU contexts' if devices[0].device_type == 'cpu' else None)


def split_sizes(n, weights):
    """Shard sizes of a batch of ``n`` samples in proportion to ``weights``, each at least 1.

    Largest remainders: the sizes add up to ``n`` and each is within one
    sample of its exact share (before the at-least-one rule moves a sample).
    """
    if any(not math.isfinite(w) or w <= 0 for w in weights):
        raise DeviceError(f'split weights must be positive numbers, got {list(weights)}')
    if n < len(weights):
        raise DeviceError(f'a batch of {n} sample(s) cannot be split across {len(weights)} '
                          f'devices; use a batch size of at least {len(weights)} or fewer devices')
    total = sum(weights)
    exact = [n * w / total for w in weights]
    sizes = [int(e) for e in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - sizes[i],
                    reverse=True)[:n - sum(sizes)]:
        sizes[i] += 1
    for i, size in enumerate(sizes):  # every device gets a sample: its gradient is fresh
        if size == 0:
            sizes[i] = 1
            sizes[sizes.index(max(sizes))] -= 1
    return sizes


def even_shares(batch_size, num_devices):
    """How ``split_batch`` shares a batch without weights, in words: ``64 per device``, or
    ``64 + 63`` for a batch that does not divide evenly (the first devices take one more)."""
    each, extra = divmod(batch_size, num_devices)
    return (' + '.join(str(each + (i < extra)) for i in range(num_devices)) if extra
            else f'{each} per device')


def split_batch(X, y, devices, weights=None):
    """Split ``X`` and ``y`` along the batch axis into one shard per device.

    Without ``weights``, ``gluon.utils.split_and_load``: a batch that does not
    divide evenly is split into shards whose sizes differ by at most one. With
    ``weights`` (one per device), shard sizes follow them (``split_sizes``):
    faster devices can take more. Either way every sample is used exactly once,
    in order.

    Parameters
    ----------
    X, y : mxnet.np.ndarray
        Features and labels with the same first dimension.
    devices : list of mxnet.Context
        Where the shards go, one shard each, in order.
    weights : list of float, optional
        Relative shares of the devices, one per device.

    Returns
    -------
    (list, list)
        Feature shards and label shards; shard ``i`` lives on ``devices[i]``.
    """
    if not devices:
        raise DeviceError('the device list is empty; pass at least one device')
    if (n := X.shape[0]) != y.shape[0]:
        raise DeviceError(f'features hold {n} samples but labels hold {y.shape[0]}')
    if weights is not None and len(weights) != len(devices):
        raise DeviceError(f'{len(weights)} split weights for {len(devices)} devices; give '
                          'one weight per device')
    # weights checked, and a batch too small for the devices refused, the same way with or without
    sizes = split_sizes(n, weights if weights is not None else [1] * len(devices))
    if weights is not None:
        bounds = [0, *itertools.accumulate(sizes)]
        return tuple([a[lo:hi].as_in_ctx(d) for lo, hi, d in zip(bounds, bounds[1:], devices)]
                     for a in (X, y))
    split_and_load = _mx().gluon.utils.split_and_load
    return tuple(split_and_load(a, devices, even_split=n % len(devices) == 0) for a in (X, y))


def _read_number(path, field=None, column=0):
    """The number in file ``path`` (its first line's ``column``, or on its line ``field:``);
    None if unreadable or 'max'."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(path) as f:
        for line in f:
            if field is None:
                return int(line.split()[column])
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024  # /proc/meminfo counts kB
    return None


def _cgroup_room():
    """Bytes this process's memory cgroup (v2, else v1) still allows; None without a limit."""
    try:
        with open('/proc/self/cgroup') as f:
            lines = [line.rstrip('\n').split(':', 2) for line in f]
    except OSError:
        return None
    rooms = []
    for _, controllers, path in (line for line in lines if len(line) == 3):
        if controllers == '':  # cgroup v2
            folder, limit_file, usage_file = '/sys/fs/cgroup' + path, 'memory.max', 'memory.current'
        elif 'memory' in controllers.split(','):  # cgroup v1
            folder, limit_file, usage_file = ('/sys/fs/cgroup/memory' + path,
                                              'memory.limit_in_bytes', 'memory.usage_in_bytes')
        else:
            continue
        limit, usage = (_read_number(os.path.join(folder, f)) for f in (limit_file, usage_file))
        if limit is not None and usage is not None and limit < 2**60:  # 2**63 - 4096: none
            rooms.append(limit - usage)
    return min(rooms) if rooms else None


def available_memory():
    """Bytes of memory this process could hold in all, or None where the system does not say.

    What it holds now (its resident set) plus what the system can still
    give without swapping (``MemAvailable`` of ``/proc/meminfo``), within
    what its memory cgroup (a container's limit) still allows.
    """
    if (free := _read_number('/proc/meminfo', 'MemAvailable')) is None:
        return None
    if (room := _cgroup_room()) is not None:
        free = min(free, max(room, 0))
    # and the resident set: statm's second number, in pages
    return free + (_read_number('/proc/self/statm', column=1) or 0) * os.sysconf('SC_PAGE_SIZE')

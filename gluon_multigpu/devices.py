"""Device lists, and putting a batch of data onto them (d2l 13.5/13.6).

Devices are always an explicit list named ``devices``: GPUs such as
``[mx.gpu(0), mx.gpu(1)]``, or CPU contexts ``[mx.cpu(0), mx.cpu(1)]``, which
MXNet schedules on separate worker threads, so the same data-parallel code
runs without a GPU.
"""
from . import _mxnet  # noqa: F401  (engine settings, then MXNet in NumPy mode)
import mxnet as mx
from mxnet import gluon, npx

from .errors import DeviceError

__all__ = ['num_gpus', 'try_gpu', 'try_all_gpus', 'cpu_devices', 'gpu_devices',
           'split_batch']


def num_gpus():
    """Return the number of GPUs MXNet can see (0 on a CPU build)."""
    try:
        return npx.num_gpus()
    except mx.base.MXNetError:  # a CUDA build on a machine without a driver
        return 0


def try_gpu(i=0):
    """Return ``gpu(i)`` if it exists, otherwise ``cpu()``."""
    return mx.gpu(i) if num_gpus() >= i + 1 else mx.cpu()


def try_all_gpus():
    """Return all available GPUs, or ``[cpu()]`` if there is no GPU."""
    devices = [mx.gpu(i) for i in range(num_gpus())]
    return devices if devices else [mx.cpu()]


def cpu_devices(n):
    """Return ``n`` CPU contexts ``[cpu(0), ..., cpu(n-1)]``.

    Parameters
    ----------
    n : int
        Number of contexts, at least 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DeviceError(f'the number of CPU devices must be a positive integer, got {n!r}')
    return [mx.cpu(i) for i in range(n)]


def gpu_devices(n):
    """Return ``[gpu(0), ..., gpu(n-1)]``, or raise DeviceError if fewer GPUs exist.

    Parameters
    ----------
    n : int
        Number of GPUs wanted, at least 1.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DeviceError(f'the number of GPUs must be a positive integer, got {n!r}')
    available = num_gpus()
    if n > available:
        have = (f'only {available} available; ask for at most {available}' if available
                else 'none is available (no GPU, or a CPU build of MXNet)')
        raise DeviceError(f'{n} GPU(s) requested but {have}, or use --cpu-devices {n} '
                          'to run the same code on CPU contexts')
    return [mx.gpu(i) for i in range(n)]


def split_batch(X, y, devices):
    """Split ``X`` and ``y`` along the batch axis into one shard per device.

    Uses ``gluon.utils.split_and_load``. A batch that does not divide evenly
    is split into shards whose sizes differ by at most one, so every sample is
    used exactly once.

    Parameters
    ----------
    X, y : mxnet.np.ndarray
        Features and labels with the same first dimension.
    devices : list of mxnet.Context
        Where the shards go, one shard each, in order.

    Returns
    -------
    (list, list)
        Feature shards and label shards; shard ``i`` lives on ``devices[i]``.
    """
    if not devices:
        raise DeviceError('the device list is empty; pass at least one device')
    n = X.shape[0]
    if n != y.shape[0]:
        raise DeviceError(f'features hold {n} samples but labels hold {y.shape[0]}')
    if n < len(devices):
        raise DeviceError(
            f'a batch of {n} sample(s) cannot be split across {len(devices)} devices; '
            f'use a batch size of at least {len(devices)} or fewer devices')
    even = n % len(devices) == 0
    return (gluon.utils.split_and_load(X, devices, even_split=even),
            gluon.utils.split_and_load(y, devices, even_split=even))

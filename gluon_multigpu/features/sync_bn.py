"""Synchronised BatchNorm (``--sync-bn``): batch statistics over the shards of all devices.

With the book's ``nn.BatchNorm`` each device normalises its shard with that
shard's mean and variance and keeps running statistics of its own shards,
so a small per-device batch gives noisy statistics and the devices' running
statistics differ. ``SyncBatchNorm`` computes the mean and variance over all
devices' shards together (MXNet's ``_contrib_SyncBatchNorm``): a step on N
devices normalises as one device would with the whole batch, and every device
keeps the same running statistics. (MXNet 1.9.1's own ``gluon.contrib.nn.SyncBatchNorm``
takes legacy arrays only; this one converts around the operator.) The operator asks three
things of its caller: a training step reaches every device (each layer waits in a barrier
for all of them; prediction does not, so evaluation may use fewer); shards of equal size
(the statistics are averaged with equal weights); and, on CPU contexts, enough scratch
copies (``check_cpu_scratch``), since a layer waiting in its barrier holds one.
"""
import functools
import itertools
import os

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet.gluon import nn
from mxnet.util import is_np_array

from ..section.model import NORMALISED
from ..errors import DeviceError, GluonMultiGPUError

__all__ = ['SyncBatchNorm', 'sync_batch_norm', 'check_training', 'check_cpu_scratch',
           'cpu_scratch_needed', 'SCRATCH_PER_CPU_CONTEXT']

#: Scratch spaces (``MXNET_CPU_TEMP_COPY``) per CPU context asked for: twice what ran.
SCRATCH_PER_CPU_CONTEXT = 128
_instances = itertools.count()


def cpu_scratch_needed(num_devices):
    """``MXNET_CPU_TEMP_COPY`` that synchronised BatchNorm needs on ``num_devices`` CPU contexts."""
    return max(256, SCRATCH_PER_CPU_CONTEXT * num_devices)


def check_cpu_scratch(num_devices, temp_copy):
    """Raise ``DeviceError`` when ``temp_copy`` scratch spaces could let ``num_devices`` CPU
    contexts wait for each other forever."""
    needed = cpu_scratch_needed(num_devices)
    if num_devices > 1 and temp_copy < needed:
        raise DeviceError(f'synchronised BatchNorm on {num_devices} CPU contexts with '
                          f'MXNET_CPU_TEMP_COPY={temp_copy} can wait forever (the contexts share '
                          f'those scratch spaces); set MXNET_CPU_TEMP_COPY={needed} or more '
                          'before MXNet loads, or unset it')


def check_training(model, devices, batch_size, split=None, book_literal=False):
    """Raise ``GluonMultiGPUError`` unless synchronised BatchNorm can train as asked (before any
    work).

    MXNet's operator averages the devices' statistics with equal weights and
    waits for every device in each step: the network must have BatchNorm
    (``model``, a name of ``model.MODELS``), the text's loop (``book_literal``)
    keeps its own ``nn.BatchNorm``, the split must be even (``split`` None or
    ``'even'``), ``batch_size`` must divide among the ``devices``, and on CPU
    contexts the scratch spaces must be enough (``check_cpu_scratch``).
    """
    if model not in NORMALISED:
        raise GluonMultiGPUError(f'`sync_bn` synchronises BatchNorm, and `model` {model} has none; '
                                 f'use `model` {", ".join(NORMALISED)} or drop `sync_bn`')
    if book_literal:
        raise GluonMultiGPUError("`book_literal` runs the text's nn.BatchNorm; drop `sync_bn`")
    if split is not None and not (isinstance(split, str) and split == 'even'):
        raise GluonMultiGPUError("`sync_bn` averages the devices' statistics with equal weights, "
                                 'so it needs equal shards; drop `split`')
    if batch_size % len(devices):
        raise DeviceError(f'`sync_bn` needs equal shards, and a batch of {batch_size} does not '
                          f'divide among {len(devices)} devices; use a `batch_size` divisible by '
                          f'{len(devices)}')
    if devices[0].device_type == 'cpu':
        # MXNet read this variable when it loaded; 4 is its default.
        check_cpu_scratch(len(devices), int(os.environ.get('MXNET_CPU_TEMP_COPY', '4')))


class SyncBatchNorm(nn.BatchNorm):
    """``nn.BatchNorm`` whose batch statistics are those of all ``num_devices`` shards together.

    Same parameters as ``nn.BatchNorm`` (``gamma``, ``beta``, ``running_mean``,
    ``running_var``), so checkpoints load either way. Every instance has its
    own synchronisation key. See the module's docstring for what a step must
    do: reach all ``num_devices`` devices, with equal shards.

    Parameters
    ----------
    num_devices : int
        Devices every training step runs on.
    **kwargs
        As ``nn.BatchNorm`` (``momentum``, ``epsilon``, ``center``, ``scale``, ...; axis 1).
    """

    def __init__(self, num_devices, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_devices, int) or isinstance(num_devices, bool) or num_devices < 1:
            raise DeviceError(f'num_devices must be a positive whole number, got {num_devices!r}')
        self.num_devices = num_devices
        # The operator keeps one barrier per key for the whole process; a key used
        # again with another device count crashes it, so every instance has its own.
        self.key = f'{self.prefix}sync{next(_instances)}_ndev{num_devices}'
        self._sync_args = {k: self._kwargs[k] for k in ('eps', 'momentum', 'fix_gamma',
                                                         'use_global_stats')}
        self._checked = False

    def forward(self, x, *args):  # pylint: disable=arguments-differ
        if not self._checked and getattr(getattr(x, 'ctx', None), 'device_type', None) == 'cpu':
            # MXNet read this variable when it loaded; 4 is its default.
            check_cpu_scratch(self.num_devices, int(os.environ.get('MXNET_CPU_TEMP_COPY', '4')))
            self._checked = True
        return super().forward(x, *args)

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        # pylint: disable=arguments-differ
        # the operator takes legacy arrays: the same memory, seen as legacy
        if numpy_mode := is_np_array():
            x, gamma, beta, running_mean, running_var = (
                a.as_nd_ndarray() for a in (x, gamma, beta, running_mean, running_var))
        out = F.contrib.SyncBatchNorm(x, gamma, beta, running_mean, running_var, name='fwd',
                                      ndev=self.num_devices, key=self.key, **self._sync_args)
        return out.as_np_ndarray() if numpy_mode else out


def sync_batch_norm(num_devices):
    """A norm-layer factory for ``model.resnet18``: ``SyncBatchNorm`` over
    ``num_devices`` devices (``nn.BatchNorm`` for one: nothing to synchronise)."""
    return nn.BatchNorm if num_devices == 1 else functools.partial(SyncBatchNorm, num_devices)

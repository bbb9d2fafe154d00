"""Where the gradients of all devices are summed: the Trainer and its kvstore (d2l 13.5/13.6).

``gluon.Trainer(..., kvstore=...)`` sums each parameter's per-device
gradients in ``trainer.step`` and updates every copy: ``local`` sums on the
CPU, ``device`` on the devices, ``nccl`` with NCCL between GPUs. ``none``
is a Trainer without a kvstore that sums the gradients itself
(``ReducingTrainer``), the from-scratch way of d2l 13.5. The parameter-server
kvstores (``dist_sync``, ``dist_device_sync``, ``dist_async``) sum over
workers on several machines too (see ``distributed``).
"""
from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx

from ..base.compat import GPU_INSTALL
from ..errors import GluonMultiGPUError
# The kvstores ``train`` accepts: of one machine (KVSTORES), of a parameter server (a worker of
# ``scripts/launch.py``: DIST_KVSTORES).
from ..base.values import DIST_KVSTORES, KVSTORES, check_lr

__all__ = ['KVSTORES', 'DIST_KVSTORES', 'kvstore_name', 'has_nccl', 'check_kvstore', 'check_lr',
           'allreduce', 'ReducingTrainer', 'make_trainer']


def kvstore_name(kvstore):
    """The name of a kvstore argument (a name, a KVStore, or ``None`` for ``'none'``)."""
    return 'none' if kvstore is None else kvstore if isinstance(kvstore, str) else kvstore.type


def has_nccl():
    """Whether the installed MXNet build was compiled with NCCL."""
    return mx.runtime.Features().is_enabled('NCCL')


def check_kvstore(kvstore, devices):
    """Raise ``GluonMultiGPUError`` unless ``train`` can use ``kvstore`` on ``devices``.

    Parameters
    ----------
    kvstore : {'local', 'device', 'nccl', 'none', None}
        ``None`` and ``'none'`` mean no kvstore (see ``ReducingTrainer``).
    devices : list of Context
    """
    name = kvstore_name(kvstore)
    if name in DIST_KVSTORES and isinstance(kvstore, str):
        raise GluonMultiGPUError(f'kvstore {name} joins a parameter server: pass the kvstore '
                                 'that distributed.connect returns, in a worker started by '
                                 'scripts/launch.py')
    if name not in KVSTORES + DIST_KVSTORES:
        raise GluonMultiGPUError(f'unknown kvstore {kvstore!r}; choose one of '
                                 f'{", ".join(KVSTORES + DIST_KVSTORES)}')
    if name == 'nccl' and not has_nccl():
        raise GluonMultiGPUError(f'kvstore nccl needs an MXNet build with NCCL, and the installed '
                                 f'mxnet {mx.__version__} has none; install the GPU build, which '
                                 f'has it ({GPU_INSTALL}), or choose local, device or none')
    if name == 'nccl' and any(d.device_type != 'gpu' for d in devices):
        raise GluonMultiGPUError('kvstore nccl sums gradients between GPUs; with CPU contexts '
                                 'choose local, device or none')


def allreduce(arrays):
    """Sum ``arrays`` (one per device) in place, so that every one holds the sum (d2l 13.5).

    The sum is formed on the first array's device, then copied back to the others.
    """
    for a in arrays[1:]:
        arrays[0][:] += a.copyto(arrays[0].ctx)
    for a in arrays[1:]:
        arrays[0].copyto(a)


class ReducingTrainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` without a kvstore that sums the gradients of all devices itself.

    MXNet's Trainer with ``kvstore=None`` lets every device update its copy
    with its own shard's gradient, so the copies drift apart. This one sums
    each parameter's gradients with ``allreduce`` before the update, which is
    what the kvstores do, in plain array operations: the baseline they are
    measured against.
    """

    def __init__(self, params, optimizer, optimizer_params=None):
        super().__init__(params, optimizer, optimizer_params, kvstore=None)

    def _allreduce_grads(self):
        for param in self._params:
            if param.grad_req != 'null' and len(param.list_grad()) > 1:
                allreduce(param.list_grad())


def make_trainer(net, lr, kvstore, multi_precision=False, lr_scheduler=None,
                 update_on_kvstore=None):
    """Return the book's SGD ``gluon.Trainer`` with the chosen kvstore.

    Parameters
    ----------
    net : Block
        The network whose parameters the Trainer updates (initialised on the devices).
    lr : float
        Learning rate, positive.
    kvstore : {'local', 'device', 'nccl', 'none', None} or KVStore
        Where gradients are summed: ``local`` on the CPU, ``device`` on the devices,
        ``nccl`` by NCCL between GPUs, ``none``/``None`` by a ``ReducingTrainer``; a
        parameter server's kvstore (``distributed.connect``) updates on its servers.
    multi_precision : bool
        Keep a float32 copy of every float16 weight and update that (mixed precision).
    lr_scheduler : callable, optional
        Gives each update's rate (``updates.Schedule``); None: ``lr`` throughout.
    update_on_kvstore : bool, optional
        False: the kvstore only sums, the Trainer updates (``updates.Update`` clips);
        None: MXNet's choice.

    Returns
    -------
    gluon.Trainer
        A ``ReducingTrainer`` for ``none``.
    """
    options = {'learning_rate': check_lr(lr), 'multi_precision': True if multi_precision else None,
               'lr_scheduler': lr_scheduler}  # (an option not asked for is not given)
    options = {key: value for key, value in options.items() if value is not None}
    if kvstore_name(kvstore) == 'none':
        return ReducingTrainer(net.collect_params(), 'sgd', options)
    # With a parameter server MXNet updates on the servers and the workers pull
    # the weights. (Pulling summed gradients instead, update_on_kvstore=False,
    # let the workers' parameters drift apart in MXNet 1.9.1: measured.)
    return mx.gluon.Trainer(net.collect_params(), 'sgd', options, kvstore=kvstore,
                            update_on_kvstore=update_on_kvstore)

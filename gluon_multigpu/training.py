"""Data-parallel training and evaluation over a list of devices (d2l 13.6).

The loop is the book's: parameters initialised on every device, each batch
split across the devices, forward and backward per shard inside one
``autograd.record()``, and ``trainer.step`` letting the kvstore sum the
gradients and update every copy of the parameters. Host-device sync points
are marked: where they sit decides what a timing means.
"""
import functools
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from . import _mxnet  # noqa: F401  (engine settings, then MXNet in NumPy mode)
import mxnet as mx
from mxnet import autograd, gluon, init, npx

from .devices import split_batch
from .errors import DeviceError, GluonMultiGPUError, TrainingDiverged
from .utils import Timer, accuracy

__all__ = ['KVSTORES', 'EpochRecord', 'TrainResult', 'evaluate_accuracy_gpus', 'train_batch',
           'train_epoch', 'kvstore_name', 'has_nccl', 'check_kvstore', 'check_lr', 'allreduce',
           'ReducingTrainer', 'make_trainer', 'hybridize', 'train', 'fit']

from .names import KVSTORES  # noqa: E402  (the back ends ``train`` accepts)


@dataclass
class EpochRecord:
    """Figures of one epoch; ``seconds`` is the training time only, as in the book."""
    epoch: int
    train_loss: float
    train_acc: float
    test_acc: float
    seconds: float
    eval_seconds: float
    samples: int

    @property
    def samples_per_sec(self):
        """Training samples per second of the epoch."""
        return self.samples / self.seconds


@dataclass
class TrainResult:
    """What ``train`` returns: the per-epoch history and how it was run."""
    devices: List[str]
    kvstore: Optional[str]
    lr: float
    epochs: List[EpochRecord] = field(default_factory=list)

    @property
    def test_acc(self):
        """Test accuracy after each epoch."""
        return [e.test_acc for e in self.epochs]

    @property
    def sec_per_epoch(self):
        """Mean training seconds per epoch (the book's ``timer.avg()``)."""
        return sum(e.seconds for e in self.epochs) / len(self.epochs)

    @property
    def samples_per_sec(self):
        """Training samples per second over all epochs."""
        return sum(e.samples for e in self.epochs) / sum(e.seconds for e in self.epochs)

    def final_line(self):
        """Return the book's closing line, e.g. ``test acc: 0.92, 13.4 sec/epoch on [gpu(0)]``."""
        return (f'test acc: {self.test_acc[-1]:.2f}, {self.sec_per_epoch:.1f} sec/epoch '
                f'on [{", ".join(self.devices)}]')

    def to_dict(self):
        """Return every figure as plain JSON-ready data."""
        d = asdict(self)
        d['sec_per_epoch'] = self.sec_per_epoch
        d['samples_per_sec'] = self.samples_per_sec
        return d


def _device_list(net):
    """The book's way of finding the devices: those of the first parameter."""
    return list(net.collect_params().values())[0].list_ctx()


def _add(acc, values):
    """Add per-device arrays into per-device running sums, on the devices (no sync).

    ``values`` may be shorter than ``acc`` (a last batch split over fewer devices).
    """
    return [v if a is None else a + v for a, v in zip(acc, values)] + acc[len(values):]


def evaluate_accuracy_gpus(net, data_iter, split_f=split_batch, devices=None):
    """Compute the accuracy of ``net`` on ``data_iter`` using several devices.

    Every sample counts once, also in a last batch that does not divide
    evenly; a last batch smaller than the number of devices uses the first
    devices only.

    Parameters
    ----------
    net : Block
        A network initialised on ``devices``.
    data_iter : iterable of (X, y)
        Batches of features and labels.
    split_f : callable
        ``split_f(X, y, devices) -> (X_shards, y_shards)``.
    devices : list of Context, optional
        Defaults to the devices of the network's first parameter, as in the book.

    Returns
    -------
    float
        Fraction of correct predictions.
    """
    devices = devices or _device_list(net)
    correct, total = [None] * len(devices), 0
    for features, labels in data_iter:
        X_shards, y_shards = split_f(features, labels, devices[:features.shape[0]])
        correct = _add(correct, [accuracy(net(X_shard), y_shard)
                                 for X_shard, y_shard in zip(X_shards, y_shards)])
        total += labels.shape[0]
    if total == 0:
        raise GluonMultiGPUError('the evaluation data is empty')
    # Sync point: the only read-back of the evaluation.
    return sum(float(c) for c in correct if c is not None) / total


def train_batch(net, X, y, loss, trainer, devices, batch_size=None):
    """Run one data-parallel training step on a batch.

    Parameters
    ----------
    net : Block
        Initialised on ``devices``.
    X, y : mxnet.np.ndarray
        The whole batch; it is split across ``devices``.
    loss : Loss
        Per-sample loss, e.g. ``SoftmaxCrossEntropyLoss``.
    trainer : gluon.Trainer
        Owns the parameters and the kvstore that sums the gradients.
    devices : list of Context
    batch_size : int, optional
        What ``trainer.step`` normalises the gradient by; defaults to the
        samples actually in the batch (the text passes its fixed batch size).

    Returns
    -------
    list of (ndarray, ndarray)
        Per shard, the loss sum and the number of correct predictions, as
        0-d arrays on the shard's device (not read back: no sync here).
    """
    X_shards, y_shards = split_batch(X, y, devices)
    with autograd.record():
        y_hats = [net(X_shard) for X_shard in X_shards]
        losses = [loss(y_hat, y_shard) for y_hat, y_shard in zip(y_hats, y_shards)]
    for l in losses:
        l.backward()
    # By default the gradient is normalised by the samples actually in the
    # batch, so a short last batch gets the same per-sample weight as the others.
    trainer.step(batch_size or X.shape[0])
    return [(l.sum(), accuracy(y_hat, y_shard))
            for l, y_hat, y_shard in zip(losses, y_hats, y_shards)]


def train_epoch(net, train_iter, loss, trainer, devices, on_progress=None,
                progress_interval=10.0):
    """Train one epoch; return ``(loss_sum, num_correct, num_samples, seconds)``.

    ``seconds`` covers the loop up to ``npx.waitall()``, so it is the time the
    devices took, not the time Python took to queue the work.

    Parameters
    ----------
    on_progress : callable, optional
        Called as ``on_progress(batches_done, num_samples, seconds_so_far)`` at
        most every ``progress_interval`` seconds.
    progress_interval : float
        Seconds between progress calls.
    """
    loss_acc, correct_acc = [None] * len(devices), [None] * len(devices)
    samples, timer = 0, Timer()
    last_report = time.perf_counter()
    for i, (X, y) in enumerate(train_iter):
        stats = train_batch(net, X, y, loss, trainer, devices)
        loss_acc = _add(loss_acc, [s[0] for s in stats])
        correct_acc = _add(correct_acc, [s[1] for s in stats])
        samples += X.shape[0]
        if on_progress is not None and time.perf_counter() - last_report >= progress_interval:
            # Sync point: wait for this step so the progress figures are real.
            loss_acc[0].wait_to_read()
            last_report = time.perf_counter()
            on_progress(i + 1, samples, timer.elapsed())
    npx.waitall()  # Sync point: every queued step has finished before the timer stops.
    seconds = timer.stop()
    if samples == 0:
        raise GluonMultiGPUError('the training data is empty')
    # Sync point (already waited for): one read-back per epoch.
    loss_sum = sum(float(a) for a in loss_acc if a is not None)
    num_correct = sum(float(a) for a in correct_acc if a is not None)
    return loss_sum, num_correct, samples, seconds


def kvstore_name(kvstore):
    """The command-line name of a kvstore argument: ``None`` is ``'none'``."""
    return 'none' if kvstore is None else kvstore


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
    if name not in KVSTORES:
        raise GluonMultiGPUError(f'unknown kvstore {kvstore!r}; choose one of {", ".join(KVSTORES)}')
    if name != 'nccl':
        return
    if not has_nccl():
        raise GluonMultiGPUError(
            f'kvstore nccl needs an MXNet build with NCCL, and the installed mxnet '
            f'{mx.__version__} has none; install a GPU build with NCCL (pip uninstall -y mxnet '
            "&& pip install -e '.[cu112]') or choose local, device or none")
    if any(d.device_type != 'gpu' for d in devices):
        raise GluonMultiGPUError('kvstore nccl sums gradients between GPUs; with CPU contexts '
                                 'choose local, device or none')


def check_lr(lr):
    """Raise unless ``lr`` is a positive finite number."""
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise GluonMultiGPUError(f'learning rate must be a positive number, got {lr!r}')


def allreduce(arrays):
    """Sum ``arrays`` (one per device) in place, so that every one holds the sum (d2l 13.5).

    The sum is formed on the first array's device, then copied back to the others.
    """
    for a in arrays[1:]:
        arrays[0][:] += a.copyto(arrays[0].ctx)
    for a in arrays[1:]:
        arrays[0].copyto(a)


class ReducingTrainer(gluon.Trainer):
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
            if param.grad_req != 'null':
                grads = param.list_grad()
                if len(grads) > 1:
                    allreduce(grads)


def make_trainer(net, lr, kvstore):
    """Return the book's SGD ``gluon.Trainer`` with the chosen kvstore.

    Parameters
    ----------
    lr : float
        Learning rate, positive.
    kvstore : {'local', 'device', 'nccl', 'none', None}
        Where gradients are summed: ``local`` on the CPU, ``device`` on the
        devices, ``nccl`` by NCCL between GPUs, ``none``/``None`` by a
        ``ReducingTrainer``.
    """
    check_lr(lr)
    if kvstore_name(kvstore) == 'none':
        return ReducingTrainer(net.collect_params(), 'sgd', {'learning_rate': lr})
    return gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': lr}, kvstore=kvstore)


def hybridize(net):
    """Compile every ``HybridBlock`` of ``net``, with its memory planned once (``static_alloc``).

    A compiled graph runs without Python between its operators and reuses
    its buffers. Blocks that are plain ``nn.Block`` (like ``BookResidual``)
    keep running eagerly; their hybridizable children are compiled.
    ``static_shape`` is not used: in MXNet 1.9.1 it drops BatchNorm's
    running-statistics update on the first steps of a block nested in an
    ``nn.Sequential`` (tests/test_fast_path.py compares with the eager loop).
    """
    with warnings.catch_warnings():
        # nn.Sequential suggests HybridSequential; hybridizing its children is what we want.
        warnings.filterwarnings('ignore', message='All children of this Sequential layer',
                                category=UserWarning)
        net.hybridize(static_alloc=True)


def train(net, train_iter, test_iter, devices, num_epochs=10, lr=0.1, kvstore='device', *,
          seed=None, initializer=None, hybrid=True, on_epoch=None, on_progress=None,
          progress_interval=10.0):
    """Train ``net`` data-parallel on ``devices`` and evaluate after each epoch (d2l 13.6).

    Parameters
    ----------
    net : Block
        An uninitialised (or to be re-initialised) network.
    train_iter, test_iter : iterable of (X, y)
        Batches; any iterable (the package's loaders, a Gluon ``DataLoader``, a list).
    devices : list of Context
        E.g. ``[mx.gpu(0), mx.gpu(1)]`` or ``cpu_devices(2)``.
    num_epochs : int
        Passes over ``train_iter``.
    lr : float
        SGD learning rate.
    kvstore : {'local', 'device', 'nccl', 'none', None}
        Gradient-synchronisation back end of the Trainer (see ``make_trainer``).
    seed : int, optional
        Seeds MXNet's generators before initialisation, for identical initial weights.
    initializer : Initializer, optional
        Defaults to the book's ``init.Normal(sigma=0.01)``.
    hybrid : bool
        Hybridize the network (see ``hybridize``): the fast path, same arithmetic.
    on_epoch : callable, optional
        Called with each ``EpochRecord`` as soon as the epoch is evaluated.
    on_progress : callable, optional
        Called as ``on_progress(epoch, batches_done, num_samples, seconds)`` during an epoch.
    progress_interval : float
        Seconds between progress calls.

    Returns
    -------
    TrainResult
    """
    def run_epoch(epoch, *args):
        progress = functools.partial(on_progress, epoch) if on_progress else None
        return train_epoch(*args, progress, progress_interval)

    def evaluate(net, data_iter):
        return evaluate_accuracy_gpus(net, data_iter, devices=devices)
    return fit(net, train_iter, test_iter, devices, run_epoch, evaluate, num_epochs=num_epochs,
               lr=lr, kvstore=kvstore, seed=seed, initializer=initializer, hybrid=hybrid,
               on_epoch=on_epoch)


def fit(net, train_iter, test_iter, devices, run_epoch, evaluate, *, num_epochs, lr, kvstore,
        seed, initializer, hybrid, on_epoch):
    """The epoch loop that ``train`` and ``book.train_book`` share; returns a ``TrainResult``.

    Checks the arguments before touching the network, initialises it on
    every device, builds the Trainer, then per epoch calls
    ``run_epoch(epoch, net, train_iter, loss, trainer, devices)`` (which
    returns ``(loss_sum, num_correct, samples, seconds)``), stops on a
    non-finite loss, times ``evaluate(net, test_iter)`` and records the epoch.
    """
    if not devices:
        raise DeviceError('the device list is empty; pass at least one device')
    if not isinstance(num_epochs, int) or num_epochs < 1:
        raise GluonMultiGPUError(f'number of epochs must be a positive integer, got {num_epochs!r}')
    check_kvstore(kvstore, devices)
    check_lr(lr)
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(initializer or init.Normal(sigma=0.01), ctx=devices, force_reinit=True)
    if hybrid:
        hybridize(net)
    trainer = make_trainer(net, lr, kvstore)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    result = TrainResult(devices=[str(d) for d in devices], kvstore=kvstore_name(kvstore), lr=lr)
    for epoch in range(1, num_epochs + 1):
        loss_sum, num_correct, samples, seconds = run_epoch(
            epoch, net, train_iter, loss, trainer, devices)
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(f'the training loss became {loss_sum} in epoch {epoch}; '
                                   f'lower the learning rate (it is {lr})')
        tic = time.perf_counter()
        test_acc = evaluate(net, test_iter)
        record = EpochRecord(epoch, loss_sum / samples, num_correct / samples, test_acc,
                             seconds, time.perf_counter() - tic, samples)
        result.epochs.append(record)
        if on_epoch is not None:
            on_epoch(record)
    return result

"""Data-parallel training and evaluation over a list of devices (d2l 13.6).

The loop is the book's: parameters initialised on every device, each batch
split across the devices, forward and backward per shard inside one
``autograd.record()``, and ``trainer.step`` letting the kvstore sum the
gradients and update every copy of the parameters. Host-device sync points
are marked: where they sit decides what a timing means.
"""
import functools
import itertools
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import List, NamedTuple, Optional

from . import _mxnet  # noqa: F401  (engine settings, then MXNet in NumPy mode)
import mxnet as mx
from mxnet import autograd, gluon, init, np, npx

from .devices import split_batch
from .errors import DeviceError, GluonMultiGPUError, Interrupted, TrainingDiverged
from .utils import Timer, accuracy

__all__ = ['KVSTORES', 'EpochRecord', 'TrainResult', 'EpochTotals', 'evaluate_accuracy_gpus',
           'train_batch', 'train_epoch', 'DivergenceWatch', 'check_finite_params',
           'kvstore_name', 'has_nccl', 'check_kvstore', 'check_lr', 'allreduce',
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


class EpochTotals(NamedTuple):
    """What one epoch (or the part of it run so far) adds up to."""
    loss_sum: float
    num_correct: float
    samples: int
    seconds: float
    batches: int
    stopped: bool = False  # ended early on request, not at the end of the data

    def __add__(self, other):
        """Totals of this part of an epoch followed by ``other``."""
        return EpochTotals(*(a + b for a, b in zip(self[:5], other[:5])), other.stopped)


class DivergenceWatch:
    """Watch every step for a non-finite loss or parameter, without a sync per step.

    Per step it keeps the loss sums of the shards and the sum of every
    parameter on one device (a NaN or infinity anywhere makes that sum
    non-finite), as arrays on the devices. ``check`` reads them back, so
    call it where the loop waits anyway; it names the first bad step.
    """

    def __init__(self, net, device, first_step=1):
        self.params = [p for p in net.collect_params().values() if p.grad_req != 'null']
        self.device, self.first_step, self.steps = device, first_step, []

    def add(self, losses):
        """Note the step just queued: its per-shard loss sums (0-d arrays)."""
        total = sum(p.data(self.device).sum() for p in self.params)
        self.steps.append((losses, total))

    def check(self):
        """Raise ``TrainingDiverged`` naming the first step with a non-finite loss or parameter."""
        if not self.steps or self._finite(self.steps[-1]):
            return
        for i, step in enumerate(self.steps):
            if not self._finite(step):
                number = self.first_step + i
                if all(math.isfinite(float(l)) for l in step[0]):
                    bad = non_finite_params(self.params) or ['a parameter']
                    raise TrainingDiverged(f'parameter {bad[0]} became non-finite at step '
                                           f'{number}', step=number)
                raise TrainingDiverged(f'the training loss became non-finite at step {number}',
                                       step=number)

    @staticmethod
    def _finite(step):
        losses, total = step
        return math.isfinite(float(total)) and all(math.isfinite(float(l)) for l in losses)


def train_epoch(net, train_iter, loss, trainer, devices, on_progress=None,
                progress_interval=10.0, *, should_stop=None, first_step=1):
    """Train one epoch; return its ``EpochTotals``.

    ``seconds`` covers the loop up to ``npx.waitall()``, so it is the time the
    devices took, not the time Python took to queue the work. A non-finite
    loss or parameter raises ``TrainingDiverged`` naming the step, at the
    next progress line or at the end of the epoch (see ``DivergenceWatch``).

    Parameters
    ----------
    on_progress : callable, optional
        Called as ``on_progress(batches_done, num_samples, seconds_so_far)`` at
        most every ``progress_interval`` seconds.
    progress_interval : float
        Seconds between progress calls.
    should_stop : callable, optional
        Asked after every step; when it returns True the epoch ends there
        (after the queued steps finish) with ``stopped=True``.
    first_step : int
        Number of the first step in the epoch, for messages (a resumed epoch starts later).
    """
    loss_acc, correct_acc = [None] * len(devices), [None] * len(devices)
    watch = DivergenceWatch(net, devices[0], first_step)
    samples, batches, stopped, timer = 0, 0, False, Timer()
    last_report = time.perf_counter()
    for X, y in train_iter:
        stats = train_batch(net, X, y, loss, trainer, devices)
        watch.add([s[0] for s in stats])
        loss_acc = _add(loss_acc, [s[0] for s in stats])
        correct_acc = _add(correct_acc, [s[1] for s in stats])
        samples += X.shape[0]
        batches += 1
        if on_progress is not None and time.perf_counter() - last_report >= progress_interval:
            # Sync point: wait for this step so the progress figures are real.
            watch.check()
            last_report = time.perf_counter()
            on_progress(first_step - 1 + batches, samples, timer.elapsed())
        if should_stop is not None and should_stop():
            stopped = True
            break
    npx.waitall()  # Sync point: every queued step has finished before the timer stops.
    seconds = timer.stop()
    if samples == 0 and not stopped and first_step == 1:
        raise GluonMultiGPUError('the training data is empty')
    # Sync point (already waited for): the read-backs of the epoch.
    watch.check()
    loss_sum = sum(float(a) for a in loss_acc if a is not None)
    num_correct = sum(float(a) for a in correct_acc if a is not None)
    return EpochTotals(loss_sum, num_correct, samples, seconds, batches, stopped)


def non_finite_params(params):
    """Names of the ``params`` that hold a NaN or an infinity on their first device (syncs)."""
    return [p.name for p in params
            if p.list_data() and not bool(np.isfinite(p.data(p.list_ctx()[0])).all())]


def check_finite_params(net):
    """Raise ``TrainingDiverged`` if any parameter, running statistics included, is not finite."""
    bad = non_finite_params(net.collect_params().values())
    if bad:
        raise TrainingDiverged(f'parameter {bad[0]} became non-finite'
                               + (f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''))


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
        raise GluonMultiGPUError(f'unknown kvstore {kvstore!r}; choose one of '
                                 f'{", ".join(KVSTORES)}')
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
          progress_interval=10.0, checkpoint=None, resume=False, should_stop=None):
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
        Called with each ``EpochRecord`` as soon as the epoch is evaluated (and checkpointed).
    on_progress : callable, optional
        Called as ``on_progress(epoch, batches_done, num_samples, seconds)`` during an epoch.
    progress_interval : float
        Seconds between progress calls.
    checkpoint : checkpoint.Checkpointer, optional
        Saves the run after every epoch, and when stopped by ``should_stop``.
    resume : bool
        Continue from ``checkpoint``'s last complete checkpoint, if it holds one.
    should_stop : callable, optional
        Asked after every step (e.g. a ``checkpoint.StopRequest`` set by a signal);
        when True, training stops after that step, is checkpointed, and
        ``Interrupted`` is raised.

    Returns
    -------
    TrainResult
    """
    def run_epoch(epoch, net, data, loss, trainer, devices, stop, first_step):
        progress = functools.partial(on_progress, epoch) if on_progress else None
        return train_epoch(net, data, loss, trainer, devices, progress, progress_interval,
                           should_stop=stop, first_step=first_step)

    def evaluate(net, data_iter):
        return evaluate_accuracy_gpus(net, data_iter, devices=devices)
    return fit(net, train_iter, test_iter, devices, run_epoch, evaluate, num_epochs=num_epochs,
               lr=lr, kvstore=kvstore, seed=seed, initializer=initializer, hybrid=hybrid,
               on_epoch=on_epoch, checkpoint=checkpoint, resume=resume, should_stop=should_stop)


def _check_fit_args(devices, num_epochs, kvstore, lr, train_iter, checkpoint):
    if not devices:
        raise DeviceError('the device list is empty; pass at least one device')
    if not isinstance(num_epochs, int) or num_epochs < 1:
        raise GluonMultiGPUError(f'number of epochs must be a positive integer, got {num_epochs!r}')
    check_kvstore(kvstore, devices)
    check_lr(lr)
    if checkpoint is not None and not hasattr(train_iter, 'epoch'):
        raise GluonMultiGPUError('checkpoints need a training loader that can replay an '
                                 "epoch's order (one with an `epoch` counter, like ArrayLoader)")


def fit(net, train_iter, test_iter, devices, run_epoch, evaluate, *, num_epochs, lr, kvstore,
        seed, initializer, hybrid, on_epoch, checkpoint=None, resume=False, should_stop=None):
    """The epoch loop that ``train`` and ``book.train_book`` share; returns a ``TrainResult``.

    Checks the arguments before touching the network, initialises it on
    every device (or restores a checkpoint), builds the Trainer, then per
    epoch calls ``run_epoch(epoch, net, data, loss, trainer, devices,
    should_stop, first_step)`` (which returns ``EpochTotals``), stops on a
    non-finite loss or parameter, times ``evaluate(net, test_iter)``,
    checkpoints, and records the epoch. See ``train`` for the arguments.

    The epoch ``e`` of a loader with an ``epoch`` counter is expected to
    draw the order of ``epoch = e - 1`` (start it at 0); a resumed run sets
    the counter so, and skips the batches a mid-epoch checkpoint had done.
    """
    _check_fit_args(devices, num_epochs, kvstore, lr, train_iter, checkpoint)
    state = checkpoint.load() if checkpoint is not None and resume else None
    if state is not None:
        checkpoint.check_epochs(state, num_epochs)
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(initializer or init.Normal(sigma=0.01), ctx=devices, force_reinit=True)
    if hybrid:
        hybridize(net)
    trainer = make_trainer(net, lr, kvstore)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    result = TrainResult(devices=[str(d) for d in devices], kvstore=kvstore_name(kvstore), lr=lr)
    start, partial = 1, None
    if state is not None:
        # Parameters before the Trainer's state: the kvstore copies the weights when it starts.
        state.restore(net, trainer, devices)
        result.epochs = list(state.history)
        start, partial = state.epoch + 1, state.partial
        train_iter.epoch = state.epoch
    for epoch in range(start, num_epochs + 1):
        data, done = train_iter, 0
        if partial is not None:
            data, done = itertools.islice(iter(train_iter), partial.batches, None), partial.batches
        if should_stop is not None and should_stop():
            raise Interrupted(getattr(should_stop, 'signum', None), epoch, done,
                              checkpoint and checkpoint.directory)
        try:
            totals = run_epoch(epoch, net, data, loss, trainer, devices, should_stop, done + 1)
            if partial is not None:
                totals, partial = partial + totals, None
            if not totals.stopped:
                check_finite_params(net)
        except TrainingDiverged as e:
            kept = (f'; the last good checkpoint ({checkpoint.describe()}) is kept'
                    if checkpoint is not None and checkpoint.exists() else '')
            raise TrainingDiverged(f'{e} in epoch {epoch}; lower the learning rate (it is {lr})'
                                   f'{kept}', epoch=epoch, step=e.step) from None
        if totals.stopped:
            if checkpoint is not None:
                checkpoint.save(net, trainer, result.epochs, epoch - 1, partial=totals)
            raise Interrupted(getattr(should_stop, 'signum', None), epoch, totals.batches,
                              checkpoint and checkpoint.directory)
        tic = time.perf_counter()
        test_acc = evaluate(net, test_iter)
        record = EpochRecord(epoch, totals.loss_sum / totals.samples,
                             totals.num_correct / totals.samples, test_acc, totals.seconds,
                             time.perf_counter() - tic, totals.samples)
        result.epochs.append(record)
        if checkpoint is not None:
            checkpoint.save(net, trainer, result.epochs, epoch)
        if on_epoch is not None:
            on_epoch(record)
    return result

"""The data-parallel step, epoch and evaluation over a list of devices (d2l 13.6).

The section's loop: each batch split across the devices, forward and
backward per shard inside one ``autograd.record()``, and ``trainer.step``
letting the kvstore sum the gradients and update every copy; the loss sums
and correct counts stay on the devices until an epoch's one read-back.
Host-device sync points are marked: where they sit decides what a timing
means. ``training`` runs these epochs with its hooks.
"""
import functools
import math
import warnings
from dataclasses import dataclass

import numpy as onp

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import autograd, cpu, np

from .recipes import recipe_of
from .devices import split_batch
from ..base import engine
from ..errors import DataError, GluonMultiGPUError, TrainingDiverged
from .results import EpochTotals
from .utils import accuracy

__all__ = ['evaluate_accuracy_gpus', 'train_batch', 'check_finite_params', 'EpochSteps', 'Step',
           'train_epoch', 'hybridize', 'batch_pair', 'check_whole']


def batch_pair(batch):
    """Return ``(X, y)`` of one batch; raise ``DataError`` unless it is such a pair."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch
    of = (f' of {len(batch)}' if isinstance(batch, (tuple, list))
          else f' of shape {tuple(batch.shape)}' if hasattr(batch, 'shape') else '')
    raise DataError(f'each batch must be a pair (inputs, labels), got a {type(batch).__name__}'
                    f'{of}; make the data yield (X, y)')


def check_whole(labels, where):
    """Raise ``DataError`` if a label of ``labels`` is not a whole number; return the labels
    on the host (those of an MXNet array read back: a sync point)."""
    labels = labels.asnumpy() if hasattr(labels, 'asnumpy') else onp.asarray(labels)
    if labels.size and labels.dtype.kind not in 'iub':
        whole = onp.isfinite(labels) & (labels == onp.round(labels)) if \
            labels.dtype.kind == 'f' else onp.zeros(labels.shape, bool)
        if not whole.all():
            raise DataError(f'label {labels[~whole].flat[0].item()!r} in {where} is not a class '
                            'number; give whole numbers from 0 (integers)')
    return labels


def evaluate_accuracy_gpus(net, data_iter, devices, split_f=split_batch, pushers=None):
    """Compute the accuracy of ``net`` on ``data_iter`` using several devices.

    Every sample counts once, also in a last batch that does not divide
    evenly; a last batch smaller than the number of devices uses the first
    devices only. Unlike the text's version (``book.evaluate_accuracy_book``),
    the counts stay on the devices until the end: one read-back per device.

    Parameters
    ----------
    net : Block
        A network initialised on ``devices``.
    data_iter : iterable of (X, y)
        Batches of features and class labels.
    devices : list of Context
        The devices the batches are split across.
    split_f : callable
        ``split_f(X, y, devices) -> (X_shards, y_shards)``.
    pushers : pushers.DevicePushers, optional
        Queue each device's forward pass from that device's own thread (``train_batch``).
        None: all from this thread.

    Returns
    -------
    float
        Fraction of correct predictions.
    """
    correct, total = [[] for _ in devices], 0
    for batch in data_iter:
        features, labels = batch_pair(batch)
        # float labels: whole numbers? (one read, the first batch)
        if total == 0 and onp.dtype(getattr(labels, 'dtype', 'i')).kind == 'f':
            check_whole(labels, 'the evaluation data')
        X_shards, y_shards = split_f(features, labels, devices[:features.shape[0]])
        calls = [functools.partial(_shard_correct, net, *s) for s in zip(X_shards, y_shards)]
        counts = pushers.run(calls, 'eval') if pushers is not None else [c() for c in calls]
        for device_counts, count in zip(correct, counts):
            device_counts.append(count)
        total += labels.shape[0]
    if total == 0:
        raise GluonMultiGPUError('the evaluation data is empty')
    return _read_sum(correct) / total


def _read_sum(per_device):
    """Sum lists of 0-d arrays, one list per device (sync point: one read-back per device)."""
    return sum(float(np.stack(values).asnumpy().astype('float64').sum())
               for values in per_device if values)


def _shard_correct(net, X_shard, y_shard):
    """One device's correct predictions on its shard (a 0-d array, not read back)."""
    return accuracy(net(X_shard), y_shard)


def _shard_step(net, loss, backward, X_shard, y_shard):
    """One device's forward and backward of a step (queued from that device's thread)."""
    with autograd.record():
        y_hat = net(X_shard)
        l = loss(y_hat, y_shard)
    backward(l)
    return y_hat, l


def train_batch(net, X, y, loss, trainer, devices, batch_size=None, split_f=split_batch,
                after_backward=None, scaler=None, pushers=None, update=None):
    """Run one data-parallel training step on a batch: the text's, split, forward and
    backward per shard, then one ``trainer.step`` that sums the gradients and updates.

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
        The devices of the step, one shard each.
    batch_size : int, optional
        What ``trainer.step`` normalises the gradient by; None: the samples in the batch.
    split_f : callable
        ``split_f(X, y, devices) -> (X_shards, y_shards)``, e.g. a ``balance.Split``.
    after_backward : callable, optional
        ``after_backward(net, devices)``, called once the backward passes are queued, before
        the gradients are summed: where each device's own work ends (``balance.TimedSplit``).
    scaler : precision.LossScaler, optional
        Scales the loss in the backward pass and divides it out in the step, which it skips
        when a gradient overflows (float16).
    pushers : pushers.DevicePushers, optional
        Queue each device's forward and backward from its own thread (its own scratch
        copies; the same arithmetic). None: all from this thread, as the text does.
    update : updates.Update, optional
        Replaces ``trainer.step``: gradients accumulated over batches, clipped, scheduled.

    Returns
    -------
    list of (ndarray, ndarray)
        Per shard, the loss sum and the number of correct predictions, as 0-d arrays on
        the shard's device (not read back: no sync here).
    """
    X_shards, y_shards = split_f(X, y, devices)
    backward = (lambda l: l.backward()) if scaler is None else scaler.backward
    if pushers is not None:
        y_hats, losses = zip(*pushers.run([functools.partial(_shard_step, net, loss, backward, *s)
                                           for s in zip(X_shards, y_shards)], 'train'))
    else:
        with autograd.record():
            y_hats = [net(X_shard) for X_shard in X_shards]
            losses = [loss(y_hat, y_shard) for y_hat, y_shard in zip(y_hats, y_shards)]
        for l in losses:
            backward(l)
    if after_backward is not None:
        after_backward(net, devices)
    if update is not None:  # accumulated, clipped or scheduled (``updates.Update``)
        update(trainer, batch_size or X.shape[0])
    elif scaler is None:
        trainer.step(batch_size or X.shape[0])
    else:  # Sync point: an overflowing step is skipped
        scaler.step(trainer, batch_size or X.shape[0], devices)
    return [(l.sum(), accuracy(y_hat, y_shard))
            for l, y_hat, y_shard in zip(losses, y_hats, y_shards)]


def check_finite_params(net, where=''):
    """Raise ``TrainingDiverged`` if any parameter, running statistics included, holds a NaN or
    an infinity on its first device (sync point: one read-back for all of them)."""
    params = [p for p in net.collect_params().values() if p.list_data()]
    ok = np.stack([np.isfinite(p.data(p.list_ctx()[0])).all().as_in_ctx(cpu())
                   for p in params]).asnumpy() if params else []
    if bad := [p.name for p, good in zip(params, ok) if not good]:
        more = f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''
        raise TrainingDiverged(f'parameter {bad[0]}{more} became non-finite{where}')


@dataclass
class EpochSteps:
    """The steps of an epoch as queued: what ``train_epoch`` returns, before any wait.

    Per device, each step's loss sum and correct count, still on the device;
    and what Python knows without waiting (samples, steps, whether a hook
    stopped the epoch). ``totals`` reads them back once the devices are done.
    """
    losses: list
    correct: list
    samples: int = 0
    batches: int = 0
    stopped: bool = False
    first_step: int = 1
    rates: list = None  # with an ``Update``: the rate of each update, and its norm (0-d arrays)
    norms: list = None

    def totals(self, seconds):
        """Return the epoch's ``EpochTotals`` (sync point: one read-back per device, one of norms).

        Raises ``TrainingDiverged`` naming the first step whose loss is not
        finite, and ``GluonMultiGPUError`` for an epoch without data.
        """
        if self.samples == 0 and not self.stopped and self.first_step == 1:
            raise GluonMultiGPUError('the training data is empty')
        per_step = [np.stack(v).asnumpy().astype('float64') for v in self.losses if v]
        step_sums = sum(per_step) if per_step else []
        for step, value in enumerate(step_sums, self.first_step):
            if not math.isfinite(value):
                raise TrainingDiverged(f'the training loss became non-finite at step {step}',
                                       step=step)
        norms = np.stack(self.norms).asnumpy().astype('float64') if self.norms else ()
        return EpochTotals(float(sum(step_sums)), _read_sum(self.correct), self.samples,
                           seconds, self.batches, self.stopped, tuple(map(float, norms)))


@dataclass
class Step:
    """What every step of an epoch needs, given once: ``train_batch``'s arguments.

    ``net``, ``loss``, ``trainer``, ``devices`` and ``split_f`` as the text has
    them; the features' ``after_backward`` and ``scaler``; ``pushers`` (a thread
    per device); ``step_scale`` (``trainer.step`` normalises by a batch's samples
    times this: a parameter server's workers); ``max_in_flight`` (steps the engine
    may run behind Python; None or 0: unbounded, as the text).
    """
    net: object
    loss: object
    trainer: object
    devices: list
    split_f: object = split_batch
    after_backward: object = None
    scaler: object = None
    pushers: object = None
    step_scale: int = 1
    max_in_flight: object = None
    update: object = None


def train_epoch(step, train_iter, *, hooks_of=None, timer=None, first_step=1):
    """Queue one epoch of steps (``step``: a ``Step``); return its ``EpochSteps`` (call
    ``npx.waitall()``, then ``totals(seconds)``).

    With ``step.max_in_flight`` K, after queuing step ``i`` it waits until the first device
    has computed the loss of step ``i - K + 1`` (which needs the update of the step before
    it), so the engine never runs more than K steps behind Python (None or 0: as far as it
    likes, the book's way). Each batch is checked by ``hooks_of.check(batch, first)`` (a
    ``checks.BatchCheck``; ``first``: the epoch's first batch), else only to be a pair.

    Parameters
    ----------
    step : Step
        ``train_batch``'s arguments, the steps in flight and the step scale.
    train_iter : iterable of (X, y)
        The epoch's batches (those left, for a resumed epoch).
    hooks_of : hooks.Run, optional
        Its hooks' ``step_end`` is called after every step; one returning True ends the
        epoch there (``stopped``), once an accumulated update in progress is complete.
    timer : utils.Timer, optional
        The epoch's timer, handed to the hooks.
    first_step : int
        Number of the first step, for the hooks and messages (a resumed epoch starts later).

    Returns
    -------
    EpochSteps
        The steps as queued, their figures still on the devices.
    """
    devices, max_in_flight, update = step.devices, step.max_in_flight, step.update
    steps = EpochSteps([[] for _ in devices], [[] for _ in devices], first_step=first_step)
    if update is not None:
        update.rates, update.norms = steps.rates, steps.norms = [], []
    if hooks_of is not None:
        hooks_of.steps = steps  # what the hooks may read of the epoch in progress
    check = getattr(hooks_of, 'check', None)
    stop = False
    for batch in train_iter:
        X, y = check(batch, steps.batches == 0) if check is not None else batch_pair(batch)
        stats = train_batch(step.net, X, y, step.loss, step.trainer, devices,
                            X.shape[0] * step.step_scale, step.split_f, step.after_backward,
                            step.scaler, step.pushers, update)
        for i, (l, c) in enumerate(stats):
            steps.losses[i].append(l)
            steps.correct[i].append(c)
        steps.samples += X.shape[0]
        steps.batches += 1
        if max_in_flight and steps.batches >= max_in_flight:
            # Sync point: this step's loss exists once the step before it was applied.
            steps.losses[0][steps.batches - max_in_flight].wait_to_read()
        stop = (hooks_of is not None and hooks_of.call('step_end', first_step - 1 + steps.batches,
                                                       steps.samples, timer)) or stop
        # A stop waits for its update: no batch may wait in a group (``count``) not applied yet
        if stop and (update is None or not update.count):
            steps.stopped = True
            break
    if update is not None and not steps.stopped:
        update.finish(step.trainer)  # an epoch's last, shorter group
    return steps


def hybridize(net):
    """Compile every ``HybridBlock`` of ``net``, as its recipe says (``recipes.recipe_of``).

    ``HybridSequential`` containers (the package's ResNet-18) compile as one
    graph, an ``nn.Sequential``'s blocks each as their own. With the recipe's
    ``static_alloc`` (ResNet-18's) a graph keeps its forward and backward
    buffers between calls; without it (the small CNN's, which gained nothing
    established) memory comes from MXNet's allocator at each call
    (docs/results.md, "Memory"); the recipe's ``mmap_threshold`` is set then.
    ``static_shape`` is not used: in MXNet 1.9.1 it drops BatchNorm's
    running-statistics update on the first steps of a block nested in an
    ``nn.Sequential`` (tests/section/test_fast_path.py).
    """
    recipe = recipe_of(net)
    with warnings.catch_warnings():
        # nn.Sequential suggests HybridSequential; hybridizing its children is what we want.
        warnings.filterwarnings('ignore', 'All children of this Sequential layer', UserWarning)
        net.hybridize(static_alloc=recipe.static_alloc)
    engine.freed_blocks_from(recipe.mmap_threshold)

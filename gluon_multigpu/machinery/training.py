"""Data-parallel training over a list of devices (d2l 13.6): ``train``, and ``Training``
that goes on.

The loop is the section's (its step, epoch and evaluation are in ``steps``:
parameters initialised on every device, each batch split across the
devices, the kvstore summing the gradients). What the section does not do
(checkpoints, stopping on a signal, progress lines) is added through
``Hook`` objects (``hooks``) that live beside their own code. The arguments
and the data are checked as ``checks`` says. Host-device sync points are
marked: where they sit decides what a timing means.
"""
import collections.abc
import dataclasses
import gc
import itertools
import time

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import gluon, npx

from ..base import engine
from .checks import BatchCheck
from .config import TrainConfig
from ..base.values import check_epochs, check_lr
from ..section.data import ArrayLoader
from ..errors import Interrupted, GluonMultiGPUError, TrainingDiverged
from ..observe.hooks import Hook, Run
from .pushers import pushers_for
from ..section.kvstores import check_kvstore, kvstore_name, make_trainer
from ..section.recipes import recipe_of
from ..section.results import EpochRecord, TrainResult
from ..section.steps import (EpochSteps, Step, check_finite_params, evaluate_accuracy_gpus,
                             hybridize, train_batch, train_epoch)
from ..section.devices import check_devices, split_batch
from ..observe.optional import optional_hooks
from .updates import epoch_rates, plan_updates, start_updates
from ..section.utils import Timer

__all__ = ['Hook', 'Run', 'EpochSteps', 'evaluate_accuracy_gpus', 'train_batch', 'train_epoch',
           'check_finite_params', 'hybridize', 'Training', 'train', 'last_run']


_LAST = {'run': None}


def last_run():
    """The ``Training`` made last in this process (by ``train`` too), or None.

    After an interrupt in a notebook, ``gm.last_run().fit()`` goes on from
    the step where it stopped.
    """
    return _LAST['run']


def _config(config, given, settings):
    """``TrainConfig.of`` with the arguments given (not None) among ``given``."""
    return TrainConfig.of(config, **{k: v for k, v in given.items() if v is not None}, **settings)


class Training:
    """A data-parallel run that can go on: ``fit(n)`` trains n more epochs, ``fit()``
    finishes an interrupted one (``train(...)`` is ``Training(...).fit(num_epochs)``).

    The Trainer's state, the data's order and the history go on from one ``fit``
    to the next; after a stop (Ctrl-C, a hook's request) ``fit()`` goes on from
    the step where it stopped.

    Parameters
    ----------
    net : Block
        The network; it is initialised on every device (``initializer``, or its
        recipe's) and hybridized unless ``hybrid`` is False.
    train_iter, test_iter : iterable
        Batches ``(X, y)`` to train on and to evaluate after each epoch
        (``test_iter`` None: no evaluation).
    devices : list of Context
        Where the network trains, e.g. ``gm.cpu_devices(2)``.
    lr, kvstore : float, str
        As ``TrainConfig``'s fields of those names.
    config : TrainConfig or None
        The settings; None: ``TrainConfig()``'s defaults.
    initializer : Initializer or None
        MXNet initializer of the weights; None: the network's recipe's.
    hybrid : bool
        Whether to hybridize the network.
    hooks : sequence of Hook
        Objects the loop calls (``hooks.Hook``): checkpoints, progress, features.
    on_epoch : callable or None
        Called with each epoch's ``EpochRecord``.
    **settings
        Any other field of ``TrainConfig`` (``seed``, ``accumulate``,
        ``clip_grad_norm``, ``lr_schedule``, ``warmup_steps``, ``max_in_flight``,
        ``tensorboard``, ``metrics``, ``log_every``, ``progress_interval`` (0: no progress
        shown), ``profile``, ``stall_timeout``), set over ``config``'s.
    """

    def __init__(self, net, train_iter, test_iter, devices, lr=None, kvstore=None, *, config=None,
                 initializer=None, hybrid=True, hooks=(), on_epoch=None, **settings):
        npx.set_np()  # MXNet keeps the NumPy semantics per thread: this one may be new
        config = _config(config, dict(lr=lr, kvstore=kvstore), settings)
        devices = check_devices(devices)
        check_kvstore(config.kvstore, devices)
        hooks = optional_hooks(hooks, config, on_epoch)
        if all(d.device_type == 'cpu' for d in devices):
            # Devices the caller built after MXNet loaded unconfigured (``[mx.cpu(0), mx.cpu(1)]``
            # as the book writes them): one warning, with the cost and the line that avoids it.
            engine.configure(cpu_devices=len(devices))
        self.recipe = recipe_of(net)
        size = getattr(train_iter, 'batch_size', None)  # a whole batch: the data's, or the recipe's
        if not (isinstance(size, int) and size > 0):
            size = self.recipe.batch_size(len(devices))
        lr = config.lr or check_lr(self.recipe.lr(size))  # (a rate given is never 0)
        self.max_in_flight = (self.recipe.max_in_flight if config.max_in_flight is None
                              else config.max_in_flight)
        self.config = dataclasses.replace(config, lr=lr)
        self.net, self.devices = net, devices
        self.result = TrainResult(devices=[str(d) for d in devices],
                                  kvstore=kvstore_name(config.kvstore), lr=lr)
        self.result.training = self
        self.run = run = Run(net, None, devices, train_iter, self.result, hooks,
                             test_iter=test_iter)
        if config.seed is not None:
            mx.random.seed(config.seed)
        net.initialize(initializer or self.recipe.initializer(), ctx=devices, force_reinit=True)
        if hybrid:
            hybridize(net)
        run.call('setup')  # the features plug into the step
        run.model = run.model or net
        if run.split is None:
            run.split, run.eval_split = split_batch, split_batch
        run.eval_split = run.eval_split or run.split
        self._update = plan_updates(run, self.config)
        self.trainer = run.trainer = make_trainer(net, lr, config.kvstore, **run.trainer_options)
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()
        run.check = BatchCheck(run.model, devices[0], train_iter)
        # ``_started``: whether the hooks' begin has returned (a failed one runs again);
        # ``_iterated``: whether an epoch has begun going through the training data
        self._started = self._iterated = False
        # ``_live``: the interrupted epoch, (its batches left, its totals so far); ``_pushers``:
        # a fit's device threads (``pushers``), while it runs; ``_target``: the epoch it ends
        self._live = self._target = self._pushers = None
        _LAST['run'] = self  # built whole: a build that raised is never the last run
        # A training and its result refer to each other: an earlier one nothing holds still
        # holds its network's copies until a full collection, which Python runs rarely (five
        # ResNet-18 trainings in one process: 4.7 GB resident after the fifth, 3.4 GB with this).
        gc.collect()

    def _record(self, epoch, totals, test_acc, eval_seconds):
        """Add the ``EpochRecord`` of ``epoch`` to the result, with the rate of each update of
        the epoch and the norms measured; return it."""
        samples = totals.samples
        record = EpochRecord(epoch, totals.loss_sum / samples, totals.num_correct / samples,
                             test_acc, totals.seconds, eval_seconds, samples)
        if self._update is not None:
            record.rates = epoch_rates(self._update, epoch, self.run.train_iter)
            if self._update.norm:
                record.grad_norms = list(totals.grad_norms)
        self.result.epochs.append(record)
        return record

    @property
    def epoch(self):
        """The last epoch completed."""
        return self.result.epochs[-1].epoch if self.result.epochs else 0

    @property
    def hooks(self):
        """The hooks of the run, the ones ``train`` added included."""
        return self.run.hooks

    def fit(self, num_epochs=None):
        """Train ``num_epochs`` more epochs (an interrupted one counts as the first); return
        ``result``.

        ``num_epochs`` None: finish what the last ``fit`` was asked for (after an
        interrupt). Raises ``Interrupted`` when a hook (Ctrl-C) stops it after
        a step; the object stays usable: ``fit()`` goes on from there.
        """
        if num_epochs is not None:  # an interrupted epoch is the first of them
            self._target = self.epoch + check_epochs(num_epochs)
        elif self._target is None or self._target <= self.epoch:
            raise GluonMultiGPUError('nothing left to continue; give `num_epochs`, the epochs to '
                                     'train')
        npx.set_np()  # for the thread that calls fit (MXNet keeps the semantics per thread)
        run = self.run
        _check_once_through(run.train_iter, self._target - self.epoch - bool(self._live),
                            self._iterated)
        run.num_epochs, run.error = self._target, None
        entered = []
        try:
            for hook in run.hooks:
                hook.enter(run)
                entered.append(hook)
            with pushers_for(run.devices) as self._pushers:
                self._fit(run)
        except BaseException as e:
            run.error = e  # how the fit ended, for the hooks' leave
            raise
        finally:
            _leave_all(run, entered)
        return self.result

    def _resume(self, run):
        """Where a fit begins: ``(first_epoch, partial, batches)``, the totals and the batches
        left of an epoch begun (by a checkpoint, or before an interrupt), or None."""
        first_epoch, partial, batches = self.epoch + 1, None, None
        if not self._started:
            starts = (hook.begin(run) for hook in run.hooks)  # a checkpoint may resume here
            first_epoch, partial = next((s for s in starts if s is not None), (1, None))
            start_updates(self._update, run.trainer, run.train_iter, self._target, first_epoch,
                          partial)
            self._started = True  # only now: a begin that raised is called again by fit()
            if partial is not None:
                batches, self._iterated = _epoch_batches(run, first_epoch, partial.batches), True
        elif self._live is not None:
            (batches, partial), first_epoch = self._live, run.epoch
        self._live = None
        return first_epoch, partial, batches

    def _fit(self, run):
        first_epoch, partial, batches = self._resume(run)
        if first_epoch > self._target:  # a resumed run that had done them all
            return
        timer = Timer()
        step = Step(run.model, self.loss, run.trainer, run.devices, run.split, run.after_backward,
                    run.scaler, self._pushers, run.step_scale, self.max_in_flight, self._update)
        for epoch in range(first_epoch, self._target + 1):
            run.epoch = epoch
            done = partial.batches if partial else 0
            if batches is None:
                batches, self._iterated = _epoch_batches(run, epoch), True
            timer.start()
            steps = train_epoch(step, batches, hooks_of=run, timer=timer, first_step=done + 1)
            npx.waitall()  # Sync point: every queued step has finished before the timer stops.
            seconds = timer.stop()
            run.call('steps_done')
            totals = _diverged_in(run, steps.totals, seconds)  # the epoch's one read-back
            totals, partial = (partial + totals if partial else totals), None
            # Stopped before the epoch's end (a stop in its last step leaves the epoch whole)
            if totals.stopped and not (hasattr(run.train_iter, '__len__')
                                       and totals.batches >= len(run.train_iter)):
                run.call('stopped', totals)
                self._live = (batches, totals)
                raise Interrupted(epoch, totals.batches, training=self)
            batches = None
            _diverged_in(run, check_finite_params, self.net, f' by step {totals.batches}')
            tic = time.perf_counter()
            test_acc = evaluate_accuracy_gpus(run.model, run.test_iter, run.devices, run.eval_split,
                                              self._pushers) if run.test_iter else None
            record = self._record(epoch, totals, test_acc, time.perf_counter() - tic)
            stop = run.call('epoch_end', record)  # every hook: the checkpoint
            # A stop asked for in the epoch's last step or its evaluation: at the epoch's end.
            if (stop or totals.stopped) and epoch < self._target:
                raise Interrupted(epoch, totals.batches, epoch_done=True, training=self)


def train(net, train_iter, test_iter, devices, num_epochs=None, lr=None, kvstore=None, *,
          config=None, initializer=None, hybrid=True, hooks=(), on_epoch=None, **settings):
    """Train ``net`` data-parallel on ``devices`` and evaluate after each epoch (d2l 13.6).

    ``Training(...).fit(num_epochs)``: every setting is a field of ``TrainConfig``,
    given as ``config`` or by name (``lr=0.1``, ``accumulate=4``); what is not
    given comes from the network's recipe (``recipes``: measured for the
    package's networks, the book's for any other). Features plug in as hooks
    (``balance``, ``precision``, ``distributed``, ``checkpoint``).

    Parameters
    ----------
    net, train_iter, test_iter, devices, config, initializer, hybrid, hooks, on_epoch
        As ``Training``'s.
    num_epochs, lr, kvstore, **settings
        Fields of ``TrainConfig`` (``num_epochs`` 10 by default), set over ``config``'s.

    Returns
    -------
    TrainResult
        Each epoch's figures (``epochs``), the devices, the kvstore and rate, and
        ``final_line()``, the book's last line; ``training`` goes on with ``fit``.
    """
    config = _config(config, dict(num_epochs=num_epochs, lr=lr, kvstore=kvstore), settings)
    return Training(net, train_iter, test_iter, devices, config=config, hooks=hooks, hybrid=hybrid,
                    initializer=initializer, on_epoch=on_epoch).fit(config.num_epochs)


def _epoch_batches(run, epoch, skip=0):
    """The batches of ``epoch`` (1-based), without the first ``skip``.

    A loader that counts its epochs (``epoch``, as the package's ``ArrayLoader``) gives this
    one's order, not the one of how often it was used before (nor of another thread's use).
    """
    data = run.train_iter
    if isinstance(data, ArrayLoader) and type(data).__iter__ is ArrayLoader.__iter__:
        # (a subclass whose own ``__iter__`` says what an epoch is goes the way below)
        data.epoch = epoch  # as if iterated: what it counts stays true
        return itertools.islice(data.batches_of(epoch - 1), skip, None)
    if isinstance(getattr(data, 'epoch', None), int):
        data.epoch = epoch - 1
    return itertools.islice(data, skip, None)


def _check_once_through(data, epochs, iterated):
    """Refuse an iterator (a generator, say) as training data where it must be gone through
    again: ``epochs`` more to start, ``iterated`` whether one was gone through already."""
    if isinstance(data, collections.abc.Iterator) and epochs > (0 if iterated else 1):
        used = 'was used up by the epochs trained so far' if iterated else \
            f'is gone through once, and {epochs} epochs were asked for'
        raise GluonMultiGPUError(f'the training data is an iterator (a generator, say), which '
                                 f'{used}; give data that can be gone through again each '
                                 'epoch: a list of batches, a DataLoader or a package loader')


def _leave_all(run, entered):
    """Call ``leave`` of every hook in ``entered``, last first, even when one raises.

    The first error is raised once all have left (unless the fit itself raised).
    """
    first = None
    for hook in reversed(entered):
        try:
            hook.leave(run)
        except Exception as e:  # pylint: disable=broad-except
            first = first or e
    if first is not None and run.error is None:
        raise first


def _diverged_in(run, fn, *args, **kwargs):
    """Call ``fn``; a ``TrainingDiverged`` gets the epoch, advice, and the hooks' notes."""
    try:
        return fn(*args, **kwargs)
    except TrainingDiverged as e:
        e.epoch = run.epoch
        e.notes.append(f'lower the learning rate (it is {run.result.lr})')
        run.call('diverged', e)
        raise

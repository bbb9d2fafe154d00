"""How a run's gradients become updates: accumulated, clipped by their global norm, scheduled.

The section updates after every batch at one rate. ``Update`` sums the
gradients of ``accumulate`` batches before one update (normalised by all
their samples), and may clip the summed gradient by its norm over every
parameter; ``Schedule`` gives the rate of each update (an MXNet learning-rate
scheduler, so that a parameter server's servers follow it too). Nothing here
reads a value back from a device: the norm and the factor that clips stay
there until the epoch ends.
"""

import warnings

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import np

from ..base.engine import caller_stacklevel
from .schedule import Schedule
from ..base.values import NO_DIST_CLIP, SCHEDULES
from ..section.kvstores import kvstore_name
from ..errors import GluonMultiGPUError, SettingWarning

__all__ = ['SCHEDULES', 'Schedule', 'Update', 'updates_per_epoch', 'plan_updates', 'start_updates',
           'epoch_rates', 'warmup_warning']

def updates_per_epoch(batches, accumulate):
    """Updates in an epoch of ``batches`` batches (a last, shorter group is an update too)."""
    return -(-batches // accumulate)


class Update:
    """``update(trainer, samples)`` after each batch's backward: an update every ``accumulate``.

    The parameters' gradients add up (``grad_req`` 'add') until the last batch
    of a group; ``finish`` updates with a group cut short (an epoch's end).
    The step is normalised by the group's samples. With ``clip`` (or ``norm``
    wanted), the Trainer only sums the gradients (``allreduce_grads``); the
    global norm of the summed gradient per sample, as one device would compute
    it, is kept per update in ``norms`` (on the first device) and the gradients
    are scaled by ``min(1, clip / norm)`` before ``trainer.update``.
    """

    def __init__(self, net, devices, accumulate=1, clip=None, norm=False, schedule=None, lr=None):
        self.params = [p for p in net.collect_params().values() if p.grad_req != 'null']
        self.devices, self.accumulate, self.clip = devices, accumulate, clip
        self.schedule, self.lr, self.norm = schedule, lr, norm or clip is not None
        self.count = self.samples = self.done = 0  # the group's batches, samples; updates made
        self.batch = None  # a batch's samples (the first's): a whole group is ``accumulate``
        self.rates, self.norms = [], []  # per update: its rate, its norm before clipping
        if accumulate > 1:
            for p in self.params:
                p.grad_req = 'add'

    def __call__(self, trainer, samples):
        """One batch's gradients are in; update if its group is whole."""
        self.count += 1
        self.samples += samples
        self.batch = self.batch or samples
        if self.count >= self.accumulate:
            self.finish(trainer)

    def finish(self, trainer):
        """Update with the batches of the group so far (none: nothing)."""
        if not self.count:
            return
        samples, count, self.count, self.samples = self.samples, self.count, 0, 0
        self.done += 1
        self.rates.append(self.schedule.rate(self.done) if self.schedule else self.lr)
        if not self.norm and count < self.accumulate and getattr(trainer, '_distributed', False) \
                and getattr(trainer, '_update_on_kvstore', False):
            # A parameter server's servers (which update) normalise every update alike: a shorter
            # group's gradients are scaled up to a whole group's (its batches are of one size).
            whole = self.batch * self.accumulate
            for g in self._grads():
                g *= whole / samples
            samples = whole
        if not self.norm:
            trainer.step(samples)
        else:
            trainer.allreduce_grads()
            self._clip(samples)
            trainer.update(samples)
        if self.accumulate > 1:  # (``Parameter.zero_grad`` fails on NumPy-mode arrays in 1.9.1)
            for g in self._grads():
                g[:] = 0

    def _grads(self):
        """Every gradient of the parameters updated, on every device."""
        return [g for p in self.params for g in p.list_grad()]

    def _clip(self, samples):
        """Keep the summed gradient's global norm per sample; scale the gradients to ``clip``."""
        squares = [(p.list_grad()[0].astype('float32') ** 2).sum() for p in self.params]
        norm = np.sqrt(np.stack(squares).sum()) / samples
        self.norms.append(norm)
        if self.clip is None:
            return
        factor = np.minimum(self.clip / (norm + 1e-12), 1.0)
        for g in self._grads():
            g *= factor.as_in_ctx(g.ctx).astype(g.dtype)


def plan_updates(run, config):
    """The ``Update`` of a run of ``config`` (a ``TrainConfig``, checked, its ``lr`` set; None:
    the section's step after every batch), its Trainer's options set in
    ``run.trainer_options``; raise for what cannot go together."""
    lr, accumulate, clip = config.lr, config.accumulate, config.clip_grad_norm
    # None: a constant rate; a ``Schedule``'s length is set when the epochs are known
    rates = (Schedule(config.lr_schedule, lr, config.warmup_steps)
             if config.lr_schedule != 'constant' or config.warmup_steps else None)
    dist = kvstore_name(config.kvstore).startswith('dist')  # (a worker's is a KVStore object)
    if clip is not None and dist:
        raise GluonMultiGPUError(NO_DIST_CLIP)
    # (a norm only for the metrics: not where the loss is scaled, nor on a parameter server)
    norm = clip is not None or (bool(getattr(run, 'want_grad_norm', False)) and not dist
                                and run.scaler is None)
    if accumulate == 1 and not norm and rates is None:
        return None
    if run.scaler is not None:
        raise GluonMultiGPUError('`accumulate`, `clip_grad_norm` and `lr_schedule` do not go '
                                 "with float16's loss scaling; train in float32 to use them")
    if rates is not None:
        run.trainer_options['lr_scheduler'] = rates
    if norm:
        run.trainer_options['update_on_kvstore'] = False  # the kvstore sums; ``Update`` updates
    return Update(run.net, run.devices, accumulate, clip, norm, rates, lr)


def start_updates(update, trainer, data, target, first_epoch, partial):
    """Set ``update``'s schedule length for ``target`` epochs of ``data`` (once) and its count
    of updates made before ``first_epoch`` (and ``partial``'s batches of it)."""
    if update is None:
        return
    batches = len(data) if hasattr(data, '__len__') else None
    per_epoch = updates_per_epoch(batches, update.accumulate) if batches else None
    schedule = update.schedule
    if schedule is not None and schedule.total is None:
        if per_epoch is None and (schedule.name != 'constant'):
            raise GluonMultiGPUError(f'`lr_schedule` {schedule.name} needs the number of '
                                     'batches of an epoch, which this training data does not '
                                     'say (no len()); give a list of batches or a package loader')
        schedule.total = target * per_epoch if per_epoch else None
        if line := warmup_warning(schedule, target, per_epoch, update.accumulate):
            warnings.warn(line, SettingWarning, stacklevel=caller_stacklevel())
    if first_epoch > 1 or partial is not None:  # resumed from a checkpoint
        update.done = (first_epoch - 1) * (per_epoch or 0) + (
            updates_per_epoch(partial.batches, update.accumulate) if partial else 0)
        if schedule is not None:  # the optimizer counts the updates made (the schedule's place)
            opt = trainer._optimizer  # pylint: disable=protected-access
            opt.begin_num_update = opt.num_update = update.done
            opt._all_index_update_counts = {0: {}}  # pylint: disable=protected-access
            opt._index_update_count = opt._all_index_update_counts[0]  # pylint: disable=W0212


def warmup_warning(schedule, epochs, per_epoch, accumulate=1):
    """The line for a warm-up that lasts the whole run of ``epochs`` of ``per_epoch`` updates
    (None: the run goes beyond it)."""
    if not schedule.total or schedule.warmup < schedule.total:
        return None
    every = f', an update every {accumulate} batches' if accumulate > 1 else ''
    never = f': the {schedule.name} schedule never starts' if schedule.name != 'constant' else ''
    return (f'`warmup_steps` {schedule.warmup} is the whole run: it makes {schedule.total} '
            f'updates ({epochs} epoch(s) of {per_epoch}{every}), all of them warm-up{never}; '
            f'give `warmup_steps` below {schedule.total}, or more `num_epochs`')


def epoch_rates(update, epoch, data):
    """The rate of each update of ``epoch`` (1-based) by ``update``, from its schedule."""
    if not hasattr(data, '__len__'):
        return list(update.rates)
    per_epoch = updates_per_epoch(len(data), update.accumulate)
    if update.schedule is None:
        return [update.lr] * per_epoch
    first = (epoch - 1) * per_epoch
    return [update.schedule.rate(k) for k in range(first + 1, first + per_epoch + 1)]

"""Progress lines within an epoch: a ``train`` hook."""
from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

from ..core.training import Hook

__all__ = ['Progress', 'Live', 'duration']


def duration(seconds):
    """``seconds`` as a short text: ``45 s``, ``12 min``, ``3.2 h``."""
    if seconds < 90:
        return f'{seconds:.0f} s'
    if seconds < 90 * 60:
        return f'{seconds / 60:.0f} min'
    return f'{seconds / 3600:.1f} h'


class Progress(Hook):
    """A ``train`` hook that reports progress within an epoch, at most every ``interval`` s.

    A line gives the run's label, the epoch, the steps done of the epoch's,
    images/s, and the estimated time left for the epoch and for the run.
    Once per run, when the first measured steps put an epoch above
    ``slow_epoch`` seconds, ``say`` gets the estimate and ``advice``.

    Parameters
    ----------
    say : callable
        Takes one line of text.
    interval : float
        Seconds between lines (0: no lines, the slow-run estimate only).
    label : str
        Names the run (its kvstore and devices), first on every line.
    num_epochs : int, optional
        Epochs of the run, for the time left of the run.
    slow_epoch : float
        Seconds per epoch above which the estimate is said.
    advice : str
        What to do instead of a slow run.
    """

    shows_progress = True

    def __init__(self, say, interval=10.0, label='', num_epochs=None, slow_epoch=600.0,
                 advice=''):
        self.say, self.interval, self.label = say, interval, label
        self.num_epochs, self.slow_epoch, self.advice = num_epochs, slow_epoch, advice
        self._epoch = self._due = self._first = None
        self._warned = False

    def step_end(self, run, step, samples, timer):
        if self._epoch != run.epoch:  # a new epoch (or the resumed part of one)
            self._epoch, self._first = run.epoch, step
            self._due = self.interval if self.interval > 0 else 30.0
        if timer.elapsed() < self._due or step == self._first:
            return
        npx.waitall()  # Sync point: the figures of a progress line are the devices' own.
        seconds = timer.elapsed()
        self._due = seconds + (self.interval if self.interval > 0 else 30.0)
        total = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
        per_step = seconds / (step - self._first + 1)
        epoch_left = per_step * (total - step) if total else None
        if epoch_left is not None and not self._warned and per_step * total > self.slow_epoch:
            self._warned = True
            self.say(f'{self.label}: at {samples / seconds:.0f} images/s an epoch takes about '
                     f'{duration(per_step * total)}'
                     + (f', the run about {duration(per_step * total * self.num_epochs)}'
                        if self.num_epochs else '') + (f'; {self.advice}' if self.advice else ''))
        if self.interval <= 0:
            return
        left = ''
        if epoch_left is not None:
            left = f', epoch ends in {duration(epoch_left)}'
            if self.num_epochs:
                run_left = epoch_left + per_step * total * (self.num_epochs - run.epoch)
                left += f', run in {duration(run_left)}'
        self.say(f'  {self.label}: epoch {run.epoch}: {step}/{total or "?"} batches, '
                 f'{samples / seconds:.0f} images/s{left}')


class Live(Hook):
    """A progress display that ``train`` adds: in a Jupyter notebook it updates in place.

    Elsewhere it shows nothing (the scripts print their own lines).
    """

    shows_progress = True

"""Progress within an epoch: ``Progress`` lines (the scripts'), ``Live`` (a notebook's display)."""
import sys
import time

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

from ..core.results import epoch_line
from ..core.hooks import Hook
from ..core.live import Live, jupyter_shell
from ..errors import Interrupted
from ..base.units import duration

__all__ = ['Progress', 'Schedule', 'Live', 'duration', 'jupyter_shell']


class Schedule:
    """Runs made one after another (a kvstore comparison): which one is running, the time left.

    ``begin`` and ``end`` bracket each run, in the order of ``names``; what a
    run took is measured between them (its set-up, training and evaluation).
    A run not yet begun is expected to take as long as the mean of those
    finished, or, before any has finished, as long as the one in progress is
    expected to take in all (``Progress`` gives its time left).

    Parameters
    ----------
    names : list of str
        The runs, in the order they are made (e.g. the kvstores).
    what : str
        What the runs make together, as the lines name it (``kvstore comparison``).
    """

    def __init__(self, names, what='comparison'):
        self.names, self.what = list(names), what
        self.index, self.took, self._began = -1, [], None
        self.estimated = False  # whether the first estimate of all the runs was said

    @property
    def name(self):
        """The run in progress (or the last one begun)."""
        return self.names[self.index]

    def position(self):
        """``2 of 3``: which run this is."""
        return f'{self.index + 1} of {len(self.names)}'

    def begin(self):
        """The next run begins."""
        self.index += 1
        self._began = time.monotonic()

    def end(self):
        """The run in progress has finished."""
        self.took.append(time.monotonic() - self._began)
        self._began = None

    def left(self, run_left=None):
        """Seconds left for all the runs, or None before any figure is known.

        ``run_left``: the seconds left of the run in progress; between runs
        (None), the runs not finished are expected to take the finished ones' mean.
        """
        finished = len(self.took)
        if self._began is None or run_left is None:
            return (sum(self.took) / finished * (len(self.names) - finished)) if finished \
                else None
        each = (sum(self.took) / finished if finished else
                time.monotonic() - self._began + run_left)
        return run_left + each * (len(self.names) - self.index - 1)


class Progress(Hook):
    """A ``train`` hook that reports progress within an epoch, at most every ``interval`` s.

    A line gives the run's label, the epoch, the steps done of the epoch's,
    images/s, and the estimated time left for the epoch and for the run
    (its epochs' steps and evaluations, each evaluation as long as the ones
    measured so far); with a ``schedule``, also which of its runs this is and
    the time left for all of them. Once per run, when the first measured
    steps put an epoch above ``slow_epoch`` seconds, ``say`` gets the estimate
    and ``advice``; in the first run of a schedule, the first measured steps
    also give one line with the estimate for all its runs.

    Parameters
    ----------
    say : callable
        Takes one line of text.
    interval : float
        Seconds between lines (0: no lines, the estimates only).
    label : str
        Names the run (its kvstore and devices), first on every line.
    num_epochs : int, optional
        Epochs of the run, for the time left of the run.
    slow_epoch : float
        Seconds per epoch above which the estimate is said.
    advice : str
        What to do instead of a slow run.
    schedule : Schedule, optional
        The runs this one is one of (begun by the caller before this run).
    """

    shows_progress = True

    def __init__(self, say, interval=10.0, label='', num_epochs=None, slow_epoch=600.0,
                 advice='', schedule=None):
        self.say, self.interval, self.label = say, interval, label
        self.num_epochs, self.slow_epoch, self.advice = num_epochs, slow_epoch, advice
        self.schedule = schedule
        self._epoch = self._due = self._first = None
        self._warned = False
        self._steps_done, self._evaluations = None, []  # seconds of each evaluation measured

    def steps_done(self, run):
        self._steps_done = time.monotonic()

    def epoch_end(self, run, record):
        if self._steps_done is not None:
            self._evaluations.append(time.monotonic() - self._steps_done)
            self._steps_done = None

    def _run_left(self, run, epoch_left, epoch_steps):
        """Seconds left of the run: this epoch's steps, the later epochs' and the evaluations."""
        if not self.num_epochs:
            return None
        evaluation = (sum(self._evaluations) / len(self._evaluations)) if self._evaluations else 0
        later = max(self.num_epochs - run.epoch, 0)
        return epoch_left + epoch_steps * later + evaluation * (later + 1)

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
        run_left = self._run_left(run, epoch_left, per_step * total) if total else None
        all_left = self.schedule.left(run_left) if self.schedule and run_left is not None \
            else None
        self._estimate_schedule(run, step - self._first + 1, all_left)
        if self.interval <= 0:
            return
        left = ''
        if epoch_left is not None:
            left = f', epoch ends in {duration(epoch_left)}'
            if run_left is not None:
                left += f', run in {duration(run_left)}'
            if all_left is not None:
                left += f', {self.schedule.what} in {duration(all_left)}'
        where = f' ({self.schedule.position()})' if self.schedule else ''
        self.say(f'  {self.label}{where}: epoch {run.epoch}: {step}/{total or "?"} batches, '
                 f'{samples / seconds:.0f} images/s{left}')

    def _estimate_schedule(self, run, steps, all_left):
        """Say once, from the first run's first measured steps, how long all the runs take."""
        schedule = self.schedule
        if schedule is None or schedule.index != 0 or all_left is None or schedule.estimated:
            return
        schedule.estimated = True
        names = schedule.names
        self.say(f'the {schedule.what} of {", ".join(names[:-1])} and {names[-1]} takes about '
                 f'{duration(all_left)} from now ({len(names)} runs, each expected to take as '
                 f'long as this one, estimated from its first {steps} steps)')



"""Progress within an epoch: ``Progress`` lines, the scripts' (a notebook's: ``live.Live``)."""
import time

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

from .hooks import Hook
from ..base.units import duration

__all__ = ['Progress', 'Schedule']


class Schedule:
    """Runs made in turn (a kvstore comparison): which one is running, the time left.

    ``begin`` and ``end`` bracket each unit of work (a run, or with ``rounds``
    above 1 one epoch of a run, the runs taking turns round after round), so
    that a unit's time counts its evaluation and a run's set-up too. A unit
    not yet begun is expected to take the mean of those finished, or, before
    any has finished, as long as the one in progress is expected to take in
    all (``Progress`` gives its time left); in the first unit, ``Progress``
    also says once what all of them will take.

    Parameters
    ----------
    names : list of str
        The runs, in the order they are made (e.g. the kvstores).
    what : str
        What the runs make together, as the lines name it (``kvstore comparison``).
    rounds : int
        Epochs of every run, taken in turn; 1: each run whole, one after another.
    """

    def __init__(self, names, what='comparison', rounds=1):
        self.names, self.what, self.rounds = list(names), what, rounds
        self.index, self.took, self._began = -1, [], None
        self.estimated = False  # whether the first estimate of all the runs was said
        self.units = len(self.names) * self.rounds  # units of work: runs, or their epochs

    def position(self):
        """``2 of 3``: which unit this is."""
        return f'{self.index + 1} of {self.units}'

    def begin(self):
        """The next unit begins."""
        self.index += 1
        self._began = time.monotonic()

    def end(self):
        """The unit in progress has finished."""
        self.took.append(time.monotonic() - self._began)
        self._began = None

    def left(self, unit_left=None):
        """Seconds left for all the units, or None before any figure is known.

        ``unit_left``: the seconds left of the unit in progress; between units
        (None), the units not finished are expected to take the finished ones' mean.
        """
        finished = len(self.took)
        mean = sum(self.took) / finished if finished else None
        if self._began is None or unit_left is None:
            return mean * (self.units - finished) if finished else None
        each = mean if finished else time.monotonic() - self._began + unit_left
        return unit_left + each * (self.units - self.index - 1)


class Progress(Hook):
    """A ``train`` hook that says a progress line within an epoch, at most every ``interval`` s.

    The line: label, epoch, steps done, images/s, the update's rate and norm
    where there are any, and the time left (with a ``schedule``, for all its
    runs too). An epoch estimated above ``slow_epoch`` s is said once, with
    ``advice``. The figures are the devices' own (it waits for them before a
    line); the time left counts the epoch's steps left at the speed measured
    since its first step, the later epochs' steps, and an evaluation after
    each epoch as long as the mean of those measured so far.

    Parameters
    ----------
    say : callable
        Takes one line of text.
    interval : float
        Seconds between two lines within an epoch (0: no lines, the estimates only).
    label : str
        Names the run (its kvstore and devices), first on every line (empty: ``training``).
    num_epochs : int, optional
        Epochs of the run, for the run's time left (None: the epoch's only).
    slow_epoch : float
        Seconds per epoch above which the estimate of the epoch and the run is said.
    advice : str
        What to do instead of a slow run, said with that estimate.
    schedule : Schedule, optional
        The runs this one is one of (begun by the caller before this run).
    """

    shows_progress = True

    def __init__(self, say, interval=10.0, label='', num_epochs=None, slow_epoch=600.0,
                 advice='', schedule=None):
        # Without a label the lines still begin with a name: ``gm.Progress(print)``.
        self.say, self.interval, self.label = say, interval, label or 'training'
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

    def _evaluation(self):
        """Seconds of an evaluation: the mean of those measured (0 before any)."""
        return (sum(self._evaluations) / len(self._evaluations)) if self._evaluations else 0

    def step_end(self, run, step, samples, timer):
        every = self.interval if self.interval > 0 else 30.0
        if self._epoch != run.epoch:  # a new epoch (or the resumed part of one)
            self._epoch, self._first, self._due = run.epoch, step, every
        if timer.elapsed() < self._due or step == self._first:
            return
        npx.waitall()  # Sync point: the figures of a progress line are the devices' own.
        seconds = timer.elapsed()
        self._due = seconds + every
        total = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
        per_step = seconds / (step - self._first + 1)
        epoch_left = per_step * (total - step) if total else None
        run_left = None
        if total and self.num_epochs:  # this epoch's steps, the later epochs' and evaluations
            later = max(self.num_epochs - run.epoch, 0)
            run_left = epoch_left + per_step * total * later + self._evaluation() * (later + 1)
        if total and not self._warned and per_step * total > self.slow_epoch:
            self._warned = True
            self.say(f'{self.label}: at {samples / seconds:.0f} images/s an epoch takes about '
                     f'{duration(per_step * total)}'
                     + (f', the run about {duration(per_step * total * self.num_epochs)}'
                        if self.num_epochs else '') + (f'; {self.advice}' if self.advice else ''))
        unit_left = run_left
        if self.schedule is not None and self.schedule.rounds > 1 and total:
            # A unit is this epoch: its steps and evaluation; the run's other epochs are units
            # of their own, and the run's time left means nothing while the runs take turns.
            unit_left, run_left = epoch_left + self._evaluation(), None
        all_left = None if not self.schedule or unit_left is None else self.schedule.left(unit_left)
        self._estimate_schedule(run, step - self._first + 1, all_left)
        if self.interval <= 0:
            return
        # (the run's and all the runs' time left are known only where the epoch's is)
        left = f', epoch ends in {duration(epoch_left)}' if total else ''
        left += f', run in {duration(run_left)}' if run_left is not None else ''
        left += f', {self.schedule.what} in {duration(all_left)}' if all_left is not None else ''
        where = f' ({self.schedule.position()})' if self.schedule else ''
        # the last update's rate and norm before clipping, where the run's updates are
        # accumulated, clipped or scheduled (read back: the devices synced)
        rates, norms = getattr(run.steps, 'rates', None), getattr(run.steps, 'norms', None)
        figures = (f', lr {rates[-1]:.3g}' if rates else '') + (
            f', grad norm {float(norms[-1]):.3g}' if norms else '')
        self.say(f'  {self.label}{where}: epoch {run.epoch}: {step}/{total or "?"} batches, '
                 f'{samples / seconds:.0f} images/s{figures}{left}')

    def _estimate_schedule(self, run, steps, all_left):
        """Say once, from the first run's first measured steps, how long all the runs take."""
        schedule = self.schedule
        if schedule is None or schedule.index != 0 or all_left is None or schedule.estimated:
            return
        schedule.estimated = True
        names = schedule.names
        units = (f'{len(names)} runs, each' if schedule.rounds == 1 else
                 f'{schedule.rounds} epochs of each, taken in turn: {schedule.units} epochs, each')
        self.say(f'the {schedule.what} of {", ".join(names[:-1])} and {names[-1]} takes about '
                 f'{duration(all_left)} from now ({units} expected to take as long as this '
                 f'one, estimated from its first {steps} steps)')



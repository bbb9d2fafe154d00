"""Progress within an epoch: ``Progress`` lines (the scripts'), ``Live`` (a notebook's display)."""
import html
import sys
import time

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

from ..core.results import epoch_line
from ..core.training import Hook
from ..errors import Interrupted
from .sweep import duration

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


def jupyter_shell():
    """The IPython shell of the Jupyter kernel this code runs in, or None.

    A kernel is an IPython ``ZMQInteractiveShell`` (or a subclass: Colab's,
    VS Code's) or an IPython started by ``IPKernelApp``; a terminal IPython or
    plain Python is not. IPython is never imported here: where it is not
    loaded already, this is no kernel.
    """
    get_ipython = getattr(sys.modules.get('IPython'), 'get_ipython', None)
    if get_ipython is None:
        return None
    try:
        shell = get_ipython()
        if shell is None:
            return None
        if any(c.__name__ == 'ZMQInteractiveShell' for c in type(shell).__mro__):
            return shell
        return shell if 'IPKernelApp' in shell.config else None
    except Exception:  # pylint: disable=broad-except  (a broken shell is no kernel)
        return None


def _ipython_display(bundle):
    """Show ``bundle`` (MIME type -> text) as a new display; return its handle."""
    from IPython.display import display  # pylint: disable=import-outside-toplevel  (loaded)
    return display(bundle, raw=True, display_id=True)


class Live(Hook):
    """A progress display that ``train`` adds: in a Jupyter notebook it updates in place.

    Each ``fit`` shows one display in its cell and changes it, at most every
    ``interval`` seconds, instead of printing line after line: the epoch, the
    steps done of the epoch's, samples/s and the time left for the epoch and
    the fit; under it, the line of every epoch finished (``epoch_line``, the
    last ``keep`` of them), and at the end how the fit ended. The figures wait
    for the devices (``npx.waitall()``), but only when the display is drawn.

    Outside a Jupyter kernel (a script, a terminal, the tests) it shows
    nothing: the scripts print their own lines (``Progress``).

    Parameters
    ----------
    interval : float
        Seconds between two drawings (the last one of a fit is always drawn).
    keep : int
        Epoch lines shown; earlier ones are counted in one line.
    display : callable, optional
        ``display(bundle) -> handle``, ``handle.update(bundle, raw=True)``,
        with ``bundle`` a dict of MIME type -> text (``text/plain``,
        ``text/html``). None: IPython's ``display`` in a Jupyter kernel,
        nothing elsewhere.

    Attributes
    ----------
    lines : list of str
        What the display shows now, as text (its ``text/plain``).
    """

    shows_progress = True

    def __init__(self, interval=1.0, keep=20, display=None):
        self.interval, self.keep, self.display = interval, keep, display
        self.lines = []
        self._handle = None
        self._epochs, self._status, self._bar = [], '', None
        self._epoch = self._first = None
        self._due = self._started = 0.0
        self._stop = None

    def enter(self, run):
        self._handle, self._epochs, self._bar, self._stop = None, [], None, None
        self._epoch = self._first = None
        show = self.display
        if show is None:
            if jupyter_shell() is None:
                return
            show = _ipython_display
        self._started = time.monotonic()
        self._due = self._started + self.interval
        done = run.result.epochs[-1].epoch if run.result.epochs else 0
        self._status = (f'epoch {run.epoch}/{run.num_epochs}: going on from the step where it '
                        'stopped' if run.epoch > done else
                        f'epoch {done + 1}/{run.num_epochs}: starting')
        try:
            self._handle = show(self._bundle())
        except Exception:  # pylint: disable=broad-except  (a display never stops training)
            self._handle = None

    def step_end(self, run, step, samples, timer):
        if self._handle is None:
            return
        if self._epoch != run.epoch:  # a new epoch (or the rest of an interrupted one)
            self._epoch, self._first = run.epoch, step
        if time.monotonic() < self._due:
            return
        npx.waitall()  # Sync point: the figures shown are the devices' own (only when drawn).
        seconds = max(timer.elapsed(), 1e-9)
        total = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
        per_step = seconds / (step - self._first + 1)
        text = (f'epoch {run.epoch}/{run.num_epochs}: step {step}/{total or "?"}, '
                f'{samples / seconds:.0f} samples/s')
        if total:
            epoch_left = per_step * max(total - step, 0)
            fit_left = epoch_left + per_step * total * max(run.num_epochs - run.epoch, 0)
            text += f', epoch ends in {duration(epoch_left)}, fit in {duration(fit_left)}'
        self._status, self._bar = text, (step, total)
        self._draw()

    def stopped(self, run, totals):
        if self._handle is None:
            return
        total = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
        self._stop = (f'interrupted in epoch {run.epoch} after step {totals.batches}'
                      f'{f"/{total}" if total else ""}: fit() goes on from there')

    def epoch_end(self, run, record):
        if self._handle is None:
            return
        self._epochs.append(epoch_line(record, run.num_epochs))
        self._status, self._bar = (f'epoch {record.epoch + 1}/{run.num_epochs}: starting'
                                   if record.epoch < run.num_epochs else ''), None
        if time.monotonic() >= self._due:  # else drawn with the next step due, or at the end
            self._draw()

    def leave(self, run):
        if self._handle is None:
            return
        error = getattr(run, 'error', None)  # what ended the fit (None: it returned)
        epochs = run.result.epochs
        last = epochs[-1].epoch if epochs else 0
        took = duration(time.monotonic() - self._started)
        if last >= run.num_epochs:
            self._status = f'done: {len(self._epochs)} epoch(s) in {took}'
        elif self._stop is not None:
            self._status = self._stop
        elif isinstance(error, Interrupted):
            self._status = (f'interrupted after epoch {last} of {run.num_epochs}: fit() goes on '
                            'from there')
        elif error is not None:
            self._status = f'stopped in epoch {run.epoch} by {type(error).__name__} ({took})'
        else:
            self._status = f'stopped after epoch {last} of {run.num_epochs} ({took})'
        self._bar = None
        self._draw()
        self._handle = None

    def _bundle(self):
        shown = self._epochs[-self.keep:] if self.keep > 0 else []
        hidden = len(self._epochs) - len(shown)
        lines = ([f'({hidden} earlier epoch(s): result.epochs)'] if hidden else []) + shown
        self.lines = lines + ([self._status] if self._status else [])
        page = '\n'.join(html.escape(line) for line in self.lines)
        bar = ''
        if self._bar is not None and self._bar[1]:
            bar = f'<progress value="{self._bar[0]}" max="{self._bar[1]}"></progress>'
        return {'text/plain': '\n'.join(self.lines),
                'text/html': f'{bar}<pre style="margin: 0">{page}</pre>'}

    def _draw(self):
        self._due = time.monotonic() + self.interval
        try:
            self._handle.update(self._bundle(), raw=True)
        except Exception:  # pylint: disable=broad-except  (a display never stops training)
            self._handle = None

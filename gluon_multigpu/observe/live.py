"""The progress ``train`` shows where a person watches: a notebook's display updated in place,
or lines on a terminal. The hook ``train`` adds unless the caller shows progress."""
import contextlib
import functools
import html
import sys
import time

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

from ..base.units import duration
from ..errors import Interrupted
from .hooks import Hook
from ..section.results import epoch_line

__all__ = ['Live', 'jupyter_shell']


def jupyter_shell():
    """The IPython shell of the Jupyter kernel this code runs in, or None.

    A kernel is an IPython ``ZMQInteractiveShell`` (or a subclass: Colab's,
    VS Code's) or an IPython started by ``IPKernelApp``; a terminal IPython or
    plain Python is not. IPython is never imported here: where it is not
    loaded already, this is no kernel.
    """
    with contextlib.suppress(Exception):  # a broken shell is no kernel
        shell = getattr(sys.modules.get('IPython'), 'get_ipython', lambda: None)()  # no IPython
        if shell is None or any(c.__name__ == 'ZMQInteractiveShell' for c in type(shell).__mro__):
            return shell  # (None: no shell)
        return shell if 'IPKernelApp' in shell.config else None
    return None


def is_terminal(stream):
    """Whether ``stream`` is a terminal (a person watching), not a pipe or a file."""
    with contextlib.suppress(AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return bool(stream.isatty())
    return False


class Live(Hook):
    """The progress display that ``train`` adds: in place in a notebook, as lines on a terminal.

    In a Jupyter kernel each ``fit`` shows one display in its cell and changes
    it, at most every ``interval`` seconds: the epoch, the steps done of the
    epoch's, samples/s and the time left for the epoch and the fit; under it,
    the line of every epoch finished (``epoch_line``, the last ``keep``), and
    at the end how the fit ended. Elsewhere, where ``stream`` is a terminal,
    it prints the same status every ``line_interval`` seconds, each epoch's
    line and the end; piped or redirected (the tests) it shows nothing. The
    figures wait for the devices (``npx.waitall()``), but only when drawn.

    Parameters
    ----------
    interval : float
        Seconds between two drawings (the last one of a fit is always drawn).
    keep : int
        Epoch lines shown; earlier ones are counted in one line (0: none shown).
    display : callable, optional
        ``display(bundle) -> handle``, then ``handle.update(bundle, raw=True)``, with
        ``bundle`` a dict of MIME type -> text (``text/plain``, ``text/html``). None:
        IPython's ``display`` in a Jupyter kernel, lines on ``stream`` elsewhere.
    stream : file, optional
        Where the lines go, if it is a terminal (None: ``sys.stderr`` at each ``fit``).
    line_interval : float
        Seconds between two status lines on a terminal.

    Attributes
    ----------
    lines : list of str
        What the display shows now, as text (its ``text/plain``).
    """

    shows_progress = True

    def __init__(self, interval=1.0, keep=20, display=None, stream=None, line_interval=10.0):
        self.interval, self.keep, self.display = interval, keep, display
        self.stream, self.line_interval = stream, line_interval
        self.lines, self._handle = [], None  # the rest is set by each ``enter``

    def enter(self, run):
        self._handle, self._epochs, self._bar, self._stop = None, [], None, None
        show, self._say, self._every = self.display, None, self.interval
        if show is None and jupyter_shell() is not None:  # IPython is loaded: a new display
            from IPython.display import display  # pylint: disable=import-outside-toplevel
            show = functools.partial(display, raw=True, display_id=True)
        elif show is None:
            stream = sys.stderr if self.stream is None else self.stream
            if not is_terminal(stream):
                return
            show, self._every = (lambda bundle: stream), self.line_interval  # lines: below
            self._say = lambda line: print(line, file=stream, flush=True)
        self._started = time.monotonic()
        self._due = self._started + self._every
        done = run.result.epochs[-1].epoch if run.result.epochs else 0
        self._status = (f'epoch {run.epoch}/{run.num_epochs}: going on from the step where it '
                        'stopped' if run.epoch > done else
                        f'epoch {done + 1}/{run.num_epochs}: starting')
        with contextlib.suppress(Exception):  # a display never stops training (no handle)
            self._handle = show(self._bundle())

    def step_end(self, run, step, samples, timer):
        if self._handle is None or time.monotonic() < self._due:
            return
        npx.waitall()  # Sync point: the figures shown are the devices' own (only when drawn).
        seconds = max(timer.elapsed(), 1e-9)
        total = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
        # the timer started at this fit's first step of the epoch (a resumed epoch's rest)
        per_step = seconds / (step - run.steps.first_step + 1)
        text = (f'epoch {run.epoch}/{run.num_epochs}: step {step}/{total or "?"}, '
                f'{samples / seconds:.0f} samples/s')
        if total:
            epoch_left = per_step * max(total - step, 0)
            fit_left = epoch_left + per_step * total * max(run.num_epochs - run.epoch, 0)
            text += f', epoch ends in {duration(epoch_left)}, fit in {duration(fit_left)}'
        self._status, self._bar = text, (step, total)
        self._draw()

    def stopped(self, run, totals):  # (said by ``leave``, if shown)
        total = f'/{len(run.train_iter)}' if hasattr(run.train_iter, '__len__') else ''
        self._stop = (f'interrupted in epoch {run.epoch} after step {totals.batches}{total}: '
                      'fit() goes on from there')

    def epoch_end(self, run, record):
        if self._handle is None:
            return
        self._epochs.append(epoch_line(record, run.num_epochs))
        self._status, self._bar = (f'epoch {record.epoch + 1}/{run.num_epochs}: starting'
                                   if record.epoch < run.num_epochs else ''), None
        if self._say is not None:  # a terminal: the epoch's line at once, no 'starting'
            self._say(self._epochs[-1])
        elif time.monotonic() >= self._due:  # else drawn with the next step due, or at the end
            self._draw()

    def leave(self, run):
        if self._handle is None:
            return
        error = getattr(run, 'error', None)  # what ended the fit (None: it returned)
        last = run.result.epochs[-1].epoch if run.result.epochs else 0
        took = duration(time.monotonic() - self._started)
        self._status, self._bar = (
            f'done: {len(self._epochs)} epoch(s) in {took}' if last >= run.num_epochs else
            self._stop if self._stop is not None else
            f'interrupted after epoch {last} of {run.num_epochs}: fit() goes on from there'
            if isinstance(error, Interrupted) else
            f'stopped in epoch {run.epoch} by {type(error).__name__} ({took})' if error is not None
            else f'stopped after epoch {last} of {run.num_epochs} ({took})'), None
        self._draw()
        self._handle = None

    def _bundle(self):
        shown = self._epochs[-self.keep:] if self.keep > 0 else []
        hidden = len(self._epochs) - len(shown)
        lines = ([f'({hidden} earlier epoch(s): result.epochs)'] if hidden else []) + shown
        self.lines = lines + ([self._status] if self._status else [])
        page = '\n'.join(html.escape(line) for line in self.lines)
        bar = f'<progress value="{self._bar[0]}" max="{self._bar[1]}"></progress>' if (
            self._bar is not None and self._bar[1]) else ''
        return {'text/plain': '\n'.join(self.lines),
                'text/html': f'{bar}<pre style="margin: 0">{page}</pre>'}

    def _draw(self):
        self._due = time.monotonic() + self._every
        if self._say is not None:
            self._say(self._status)
            return
        try:
            self._handle.update(self._bundle(), raw=True)
        except Exception:  # pylint: disable=broad-except  (a display never stops training)
            self._handle = None


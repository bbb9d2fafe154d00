"""A notebook's display of a run, updated in place: the hook ``train`` adds unless the caller shows progress."""
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
        Epoch lines shown; earlier ones are counted in one line (0: none shown).
    display : callable, optional
        ``display(bundle) -> handle``, then ``handle.update(bundle, raw=True)``, with
        ``bundle`` a dict of MIME type -> text (``text/plain``, ``text/html``). None:
        IPython's ``display`` in a Jupyter kernel, nothing elsewhere.

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

"""Ctrl-C in a notebook or a Python session: the hook ``train`` adds unless the caller's handles signals."""
import signal
import threading
import time

from ..base import signals
from .hooks import Hook

__all__ = ['Interruptible']


class Interruptible(Hook):
    """Ctrl-C (SIGINT) stops ``train`` after the current step, and never ends the process.

    What ``train`` and ``Training`` add unless a hook of the caller handles signals (the
    scripts bring ``StopRequest``). During each ``fit`` the first SIGINT (Ctrl-C, a notebook's
    stop button, ``kill -INT``) is acknowledged at once with one line, even while the main
    thread waits inside MXNet, and the loop stops after the step in progress: ``fit`` raises
    ``Interrupted`` (in the epoch's last step or its evaluation, at that epoch's end), and
    ``fit()`` goes on from there. Further SIGINTs only say that the run is still stopping (at
    most once every ``REPEAT_EVERY`` seconds). The handler is installed in ``enter`` and the
    one before it (a Jupyter kernel's own) comes back in ``leave``, once a repeat of the
    first SIGINT can no longer arrive. Only a handler that interrupts Python is replaced: a
    program's own handler, an ignored SIGINT, and any thread but the main one are left alone.

    Parameters
    ----------
    say : callable
        Takes one line of text (``print``: in a notebook it shows in the cell).

    Attributes
    ----------
    signum : int or None
        The first SIGINT of the current ``fit`` (None: none came).
    requests : int
        The SIGINTs the handler has received during the current ``fit``.
    """

    handles_signals = True

    #: Seconds between two "still stopping" lines, however often Ctrl-C is pressed.
    REPEAT_EVERY = 1.0

    def __init__(self, say=print):
        self.say, self.signum, self.requests = say, None, 0
        self._previous, self._said, self._pending = None, None, []  # (a handler: while installed)
        self._reader = signals.WakeupReader([signal.SIGINT], self._heard, 'interruptible')
        self._heard_count, self._first_at = 0, None

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        # Runs in the main thread between two bytecodes, possibly in the middle of a step:
        # it only notes the request (and says so without a watcher); it must never raise there.
        self.requests += 1
        if self.signum is None:
            self.signum = signum
            self._first_at = self._first_at or time.monotonic()
        if not self._reader.reading:
            self._acknowledge(self.requests)

    def _acknowledge(self, count):
        """Say that the ``count``-th SIGINT of this fit came."""
        if count == 1:
            self._tell('interrupted: stopping after the current step (the run is kept: fit() '
                       'goes on from there)')
        elif self._said is None or time.monotonic() - self._said >= self.REPEAT_EVERY:
            self._said = time.monotonic()
            self._tell('interrupted again: still stopping after the current step (the run and '
                       'the process are kept)')

    def _tell(self, line):
        try:
            self.say(line)
        except Exception:  # pylint: disable=broad-except
            # e.g. print interrupted inside print: a reentrant write; said at the next step.
            self._pending.append(line)

    def _flush(self):
        while self._pending:
            try:
                self.say(self._pending[0])
            except Exception:  # pylint: disable=broad-except
                return
            self._pending.pop(0)

    def _heard(self, signum):  # pylint: disable=unused-argument
        """A SIGINT as it arrives (the reader's thread), while the main thread waits in MXNet."""
        self._heard_count += 1
        self._first_at = self._first_at or time.monotonic()
        self._acknowledge(self._heard_count)

    def enter(self, run):
        self.signum, self.requests, self._said, self._pending = None, 0, None, []
        self._first_at = None
        if self._previous is not None or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if not signals.interrupts_python(previous):
            return  # a program's own handler, ignored, or outside Python: left as it is
        signals.install(self._handle, (signal.SIGINT,))
        self._previous, self._heard_count = previous, 0
        self._reader.start(only_if_free=True)  # an event loop's stays theirs: the handler speaks

    def leave(self, run):
        if self._previous is not None:
            try:
                signals.wait_out(self._first_at)  # a repeat of this SIGINT still finds the handler
                self._reader.stop()
            finally:
                previous, self._previous = self._previous, None
                signals.restore({signal.SIGINT: previous})
        self._flush()
        epochs = run.result.epochs if run.result is not None else []
        if self.signum is not None and epochs and epochs[-1].epoch >= run.num_epochs:
            signals.quietly(self.say, 'the interrupt came after the last step: the fit is complete')

    def step_end(self, run, step, samples, timer):
        self._flush()  # what a SIGINT could not say at once
        return self.signum is not None

    def epoch_end(self, run, record):
        return self.signum is not None

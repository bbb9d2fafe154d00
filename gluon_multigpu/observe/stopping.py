"""Stopping a run on SIGINT, SIGTERM or SIGHUP after the current step (and ``StallGuard``,
which ends a run whose steps stalled, from ``observe.stall``).

Two hooks stop a run on a signal. ``StopRequest`` is the scripts' (a command
line, where a second Ctrl-C may end the process); ``Interruptible`` is what
``train`` adds everywhere else (a notebook, a Python session): Ctrl-C stops
after the current step, and no number of Ctrl-Cs ends the process.

The loop spends most of its time blocked inside MXNet, where a Python handler
runs only once the call returns; so ``StopRequest`` also reads the signal
wake-up descriptor from a thread (only the bytes of the signals it handles
count): the first signal is acknowledged at once and a second acts at once.
SIGHUP stops like SIGTERM, but a repeated SIGHUP (a closing session may send
several) is no second request; a SIGHUP ignored under ``nohup`` stays ignored.
Here too: the lines a run says when it stops (the programs': ``cli.messages``).
"""
import contextlib
import os
import signal
import sys
import time

from ..base import signals
from ..base.signals import SAME_REQUEST, STOP_SIGNALS
from .hooks import Hook
from .stall import StallGuard
from ..errors import Interrupted
from ..filesafety.output import discard_unfinished

__all__ = ['StopRequest', 'StallGuard', 'SAME_REQUEST',
           'STOP_SIGNALS', 'say_quietly', 'signal_name', 'comparison_why', 'launcher_stops']

def say_quietly(line, stream=None):
    """Print ``line`` on ``stream`` (stderr) and flush; a terminal that is gone is not an error."""
    # EIO (a closed terminal), EPIPE; ValueError: the stream is closed
    with contextlib.suppress(OSError, ValueError):
        print(line, file=stream or sys.stderr, flush=True)


def signal_name(signum, default='a stop request'):
    """``SIGINT``, ``SIGTERM``, ...; ``default`` where no signal caused the stop."""
    return signal.Signals(signum).name if signum else default


def comparison_why(signum, current):
    """Why the outputs of a stopped comparison are partial: stopped during ``current`` (the
    epoch in progress, in words) or between two epochs (None)."""
    during = f'during {current}' if current else 'between two epochs'
    return f'interrupted by {signal_name(signum, "a stop")} {during}'


def launcher_stops(step):
    """A worker's line when the launcher stops the job on a step every worker stops on."""
    return f'the launcher stops the job: stopping after step {step}, as every worker does'


class StopRequest(Hook):
    """A flag that SIGINT, SIGTERM and SIGHUP set, asked by ``train`` after every step (a hook).

    ``train`` also asks it after every epoch (``epoch_end``): a signal during
    an evaluation stops the run at that epoch's end. Calling it asks the same
    (``train_book`` takes it as ``stop``).

    Use as a context manager in the main thread: the previous handlers come back on exit,
    once a repeat of the first signal can no longer arrive (``SAME_REQUEST``). The first
    signal stops the loop after the current step; where ``exit_on_second``, a second one
    (not a repeated SIGHUP) ends the process at once with status 128 + the signal, and a
    checkpoint being written is left as its last complete version.

    Parameters
    ----------
    on_signal : callable, optional
        Called with the signal number as soon as the first signal arrives (from a thread).
    on_second : callable, optional
        Called with the signal number before a second signal ends the process.
    exit_on_second : bool, optional
        Whether a second signal ends the process (``os._exit``): a command line's behaviour.
        None (default): yes, except inside a Jupyter kernel, which must outlive the run
        (there a second signal changes nothing: the run still stops after the step).

    Attributes
    ----------
    signum : int or None
        The first signal received (None: none yet).
    """

    handles_signals = True
    #: Seconds after the first signal within which another is the same request (see above).
    SAME_REQUEST = SAME_REQUEST

    def __init__(self, on_signal=None, on_second=None, exit_on_second=None):
        self.signum, self.on_signal, self.on_second = None, on_signal, on_second
        self.exit_on_second = exit_on_second
        self._previous, self._reader, self._watching = {}, None, False
        self._seen, self._exit, self._first_at = 0, True, None

    def __call__(self, *hook_args):
        return self.signum is not None

    step_end = epoch_end = __call__  # a hook: True stops the run there

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        # Runs in the main thread once it is back in Python: the flag the loop reads.
        if self.signum is None:
            self.signum = signum
            if not self._watching:
                self._first_at = time.monotonic()
        elif (not self._watching and signum != signal.SIGHUP and self._exit
              and not signals.repeated(self._first_at)):  # no reader: a second request ends it here
            raise Interrupted(signum=signum, now=True,
                              message=f'stopped at once by a second {signal.Signals(signum).name}')

    def _heard(self, signum):
        """A signal as it arrives (the reader's thread), also while the main thread is in MXNet."""
        if self._seen and signals.repeated(self._first_at):
            return  # one Ctrl-C delivered twice (a wrapper that forwards it)
        self._seen += 1
        if self._seen == 1:
            self._first_at = time.monotonic()
            if self.on_signal is not None:
                signals.quietly(self.on_signal, signum)
        elif signum != signal.SIGHUP and self._exit:  # a closing session repeats SIGHUP
            if self.on_second is not None:
                signals.quietly(self.on_second, signum)
            discard_unfinished()  # no half-written output left behind
            os._exit(128 + signum)  # pylint: disable=protected-access

    def __enter__(self):
        self._exit = self.exit_on_second
        if self._exit is None:
            from .live import jupyter_shell  # pylint: disable=import-outside-toplevel
            self._exit = jupyter_shell() is None
        self._previous = signals.install(self._handle, STOP_SIGNALS)  # nohup's SIGHUP stays ignored
        self._reader = signals.WakeupReader(self._previous, self._heard, 'stop-request')
        self._watching = self._reader.start()
        return self

    def __exit__(self, *exc):
        signals.wait_out(self._first_at)  # a repeat of the first signal still finds this hook
        self._reader.stop()  # the handler stays this request's until the previous comes back
        signals.restore(self._previous)

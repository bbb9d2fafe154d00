"""A run whose steps stopped (a stall): found, its stacks written, and ended, or its launcher told.

``StallGuard`` is the watch: a thread that calls ``on_stall`` when no step
was queued for a long time. ``stall_hook(seconds)`` is what ``train``'s
``stall_timeout`` adds. In a process of its own (``StallHook``) a stall
writes every thread's Python stack (``base.stacks``), one line, and ends the
process with status 3 (``STALLED``): a step stuck inside MXNet cannot be
called off, and every later MXNet call, a read of the parameters included,
would wait on it too. Under ``scripts/launch.py`` (``LaunchedStall``) the
launcher watches every worker's steps (``StepReports``) and names the one
behind; the hook tells it the time, and lets it ask for the stacks.
"""
import contextlib
import math
import numbers
import os
import sys
import time

from ..base import protocol, stacks
from ..base.background import Background
from ..errors import GluonMultiGPUError
from .hooks import Hook

__all__ = ['STALLED', 'StallGuard', 'StepReports', 'StallHook', 'LaunchedStall', 'stall_hook',
           'stall_line']

#: The exit status of a process, and of a launched job, whose steps stalled.
STALLED = 3


class StallGuard(Background, Hook):
    """Calls ``on_stall(seconds_waited)`` when no training step was queued for
    ``max(seconds, factor x the longest step so far)``: a deadlock.

    Watched from an epoch's first step until its steps are done (not the
    evaluation), by a thread that looks once a second. A context manager (the
    thread ends with it); only for steps in flight bounded: the time since the
    last step was queued is then also the time since the step before it finished,
    where an unbounded loop rightly waits a whole epoch at its end. Made for
    MXNet's synchronised BatchNorm, whose barrier has no time limit and which
    Python cannot interrupt: ``on_stall`` should end the process.

    Parameters
    ----------
    on_stall : callable
        Called from the watch's thread with the seconds waited (a float), once per stall.
    seconds : float
        Seconds without a queued step that always count as a stall.
    factor : float
        A wait is a stall only past ``factor`` times the longest time between two steps
        seen so far (0: ``seconds`` alone decides).
    """

    thread_name = 'stall-guard'

    def __init__(self, on_stall, seconds=120.0, factor=20.0):
        self.on_stall, self.seconds, self.factor = on_stall, seconds, factor
        self._last = None  # when the last step was queued; None: not watching
        self._longest = 0.0

    def work(self):
        while not self.finished.wait(1.0):
            if (last := self._last) is not None and (waited := time.monotonic() - last) > max(
                    self.seconds, self.factor * self._longest):
                self._last = None
                self.on_stall(waited)

    def step_end(self, run, step, samples, timer):
        now = time.monotonic()
        if self._last is not None:
            self._longest = max(self._longest, now - self._last)
        self._last = now

    def _rest(self, *args):
        self._last = None

    steps_done = stopped = epoch_end = diverged = _rest


def _seconds(value):
    """``0.31 s``, ``4.2 s``, ``61 s``: a time of a stall line, small ones not rounded to 0."""
    return f'{value:.2g} s' if value < 10 else f'{value:.0f} s'


def stall_line(seconds, waited, longest=0.0):
    """What a stalled process says (its arguments in backquotes, as the library names them).

    ``waited``: the seconds without a queued step; ``longest``: the longest time between two
    steps seen before (0: fewer than two steps seen).
    """
    seen = (f'the steps before came at most {_seconds(longest)} apart' if longest else
            'no time between two steps was measured yet')
    # (a wait not far beyond the steps seen, or no step time to compare with: maybe a slow step)
    cause = 'the run is stuck' if longest and 2 * longest < seconds else (
        'the run is stuck, or its steps take longer than that: give a `stall_timeout` several '
        'times the longest step')
    return (f'no training step was queued for {_seconds(waited)}, past `stall_timeout` '
            f'{_seconds(seconds)} ({seen}): {cause} (every thread\'s Python stack is above); '
            f'ending the process with status {STALLED}: a step stuck inside MXNet cannot be '
            'called off')


def _check_bounded(run):
    """Refuse a watch of the time between steps when nothing bounds the steps in flight."""
    training = getattr(run.result, 'training', None)
    if training is not None and not getattr(training, 'max_in_flight', 1):
        raise GluonMultiGPUError('`stall_timeout` watches the time between steps, and with '
                                 '`max_in_flight` None or 0 a whole epoch is queued at once '
                                 'and waited for at its end; give `max_in_flight` 1')


class StepReports(Hook):
    """A launched worker's steps, told to its launcher on the control pipe ``write_fd``.

    ``step N`` as each is queued (N counts every step of the process), ``rest``
    once an epoch's steps are done (evaluation and the epoch's end are not
    watched), ``watch`` at an epoch's end when another follows. One hook of a
    run says them (``reports_steps``): ``distributed.Control``, else
    ``LaunchedStall``.
    """

    reports_steps = True

    def __init__(self, write_fd):
        self.steps, self._write_fd = 0, write_fd

    def report(self, message):
        """Send one line to the launcher (quietly nothing if it cannot be)."""
        with contextlib.suppress(OSError):
            os.write(self._write_fd, (message + '\n').encode())

    def step_end(self, run, step, samples, timer):
        self.steps += 1
        self.report(f'step {self.steps}')

    def steps_done(self, run, totals=None):
        self.report('rest')

    stopped = steps_done  # (after the steps of an epoch stopped: ``totals``)

    def epoch_end(self, run, record):
        if run.epoch < run.num_epochs:
            self.report('watch')


class StallHook(StallGuard):
    """``stall_hook`` in a process of its own: on a stall, the stacks, one line, status 3.

    Each ``fit`` is watched from its first step until its epoch's steps are
    done, and again from an epoch's end to the next epoch's first step. ``line(waited,
    longest)`` is the line said (default: ``stall_line``'s, see there).
    """

    def __init__(self, seconds, line=None):
        super().__init__(self._stalled, seconds=seconds, factor=0.0)
        self.line = line or (lambda waited, longest:
                             f'error: {stall_line(seconds, waited, longest)}')

    def enter(self, run):
        _check_bounded(run)
        self.__enter__()

    def leave(self, run):
        self.__exit__(None, None, None)

    def epoch_end(self, run, record):
        self._last = time.monotonic() if run.epoch < run.num_epochs else None

    def _stalled(self, waited):
        stacks.dump()
        print(self.line(waited, self._longest), file=sys.stderr, flush=True)
        os._exit(STALLED)  # pylint: disable=protected-access  (the engine cannot be unblocked)


class LaunchedStall(StepReports):
    """``stall_hook`` under ``scripts/launch.py``: the launcher watches the workers' steps.

    It tells the launcher the time (``stall S``), makes ``stacks.DUMP_SIGNAL``
    write the stacks, and reports the steps itself unless another hook of the
    run does (``distributed.Control``).
    """

    def __init__(self, seconds, write_fd):
        super().__init__(write_fd)
        self.seconds, self.active = seconds, True

    def enter(self, run):
        _check_bounded(run)
        stacks.dump_on_signal()
        self.active = not any(getattr(h, 'reports_steps', False) for h in run.hooks
                              if h is not self)
        super().report(f'stall {self.seconds:g}')

    def report(self, message):
        """The steps' lines, unless another hook of the run says them."""
        if self.active:
            super().report(message)


def stall_hook(seconds, line=None, environ=None):
    """The hook of ``train``'s ``stall_timeout``: ``seconds`` without a step ends the run.

    None for None or 0 (not watched); ``StallHook`` in a process of its own
    (``line``: what it says, see there), ``LaunchedStall`` under
    ``scripts/launch.py`` (``environ``: where to look, default ``os.environ``).
    Raises ``GluonMultiGPUError`` for a value that is not a time.
    """
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
                                or not math.isfinite(seconds) or seconds < 0):
        raise GluonMultiGPUError(f'`stall_timeout` {seconds!r} is not a number of seconds of 0 '
                                 'or more; give the longest wait for a step, or 0 or None for '
                                 'no watch')
    if not seconds:  # None or 0: not watched
        return None
    fds = protocol.control_fds(environ)
    return LaunchedStall(float(seconds), fds[1]) if fds else StallHook(float(seconds), line)

"""Stopping a run on SIGINT, SIGTERM or SIGHUP after the current step, or when its steps stall.

Two hooks stop a run on a signal. ``StopRequest`` is the scripts' (a command
line, where a second Ctrl-C may end the process); ``Interruptible`` is what
``train`` adds everywhere else (a notebook, a Python session): Ctrl-C stops
after the current step, and no number of Ctrl-Cs ends the process.

Python runs a signal handler only between bytecodes, and the training loop
spends most of its time blocked inside MXNet (``wait_to_read``,
``npx.waitall``), so a handler alone may act only a step later. ``StopRequest``
therefore also listens on the signal wake-up file descriptor from a thread:
the first signal is acknowledged at once (``on_signal``) and the loop stops
after the current step; a second signal ends the process at once (``os._exit``,
status 128 + the signal), after ``on_second`` has said so. A checkpoint in
the middle of being written is then left as its last complete version.
Python writes a byte to that descriptor for every signal that has a Python
handler (SIGCHLD, SIGWINCH, ... where a library installed one); only the
bytes of the signals ``StopRequest`` handles count. Inside a Jupyter kernel a
second signal does not end the process (the kernel would die with the run):
the run still stops after the current step.

A signal within ``SAME_REQUEST`` seconds of the first is the same request,
not a second one, for both hooks, and also once the run has stopped: a hook
hands the signals back (``__exit__``, ``leave``) only once that window has
passed, so a repeat never reaches the handler that was there before
(Python's, which would raise ``KeyboardInterrupt`` in the caller's code).
One Ctrl-C can arrive several times within milliseconds: the terminal sends
SIGINT to the whole foreground process group, so a wrapper in that group
that forwards signals to its child (``timeout``, which forwards it to the
child and again to its process group) delivers it again. Nobody
presses Ctrl-C twice within half a second meaning "now" rather than "stop".

SIGHUP (the terminal or the ssh session closed) stops like SIGTERM. A
repeated SIGHUP is not a second request: a closing session may send it more
than once, and nobody is there to ask twice. A SIGHUP that was ignored when
the context was entered (``nohup``) stays ignored. (SIGINT is handled even
where a shell started the run in the background with SIGINT ignored:
``kill -INT`` still stops it after a step, as before.)
"""
import os
import signal
import socket
import threading
import time

from ..core.training import Hook
from .files import discard_unfinished

__all__ = ['StopRequest', 'StallGuard', 'Interruptible', 'SAME_REQUEST']

#: Seconds after the first signal within which another is the same request (see above).
SAME_REQUEST = 0.5


def _repeated(first_at):
    """Whether a signal arriving now repeats one that came at ``first_at`` (None: none came)."""
    return first_at is not None and time.monotonic() - first_at < SAME_REQUEST


def _wait_out(first_at):
    """Return once the window of a signal that came at ``first_at`` has passed.

    Called with the hook's handlers still installed: a repeat that arrives
    meanwhile finds them, and is the same request.
    """
    while _repeated(first_at):
        time.sleep(max(0.0, first_at + SAME_REQUEST - time.monotonic()))


class StopRequest(Hook):
    """A flag that SIGINT, SIGTERM and SIGHUP set, asked by ``train`` after every step (a hook).

    ``train`` also asks it after every epoch (``epoch_end``): a signal during
    an evaluation stops the run at that epoch's end. Calling it asks the same
    (``train_book`` takes it as ``stop``).

    Use as a context manager in the main thread: the previous handlers come back on exit.

    Parameters
    ----------
    on_signal : callable, optional
        Called with the signal number as soon as the first signal arrives (from a thread).
    on_second : callable, optional
        Called with the signal number before a second signal ends the process.
    exit_on_second : bool, optional
        Whether a second signal ends the process (``os._exit``): a command
        line's behaviour. None (default): yes, except inside a Jupyter kernel,
        which must outlive the run (there a second signal changes nothing).

    Attributes
    ----------
    signum : int or None
        The first signal received.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handles_signals = True
    #: Seconds after the first signal within which another is the same request (see above).
    SAME_REQUEST = SAME_REQUEST

    def __init__(self, on_signal=None, on_second=None, exit_on_second=None):
        self.signum, self.on_signal, self.on_second = None, on_signal, on_second
        self.exit_on_second = exit_on_second
        self._previous, self._wakeup, self._sockets, self._thread = {}, None, None, None
        self._seen, self._exit, self._first_at = 0, True, None

    def __call__(self):
        return self.signum is not None

    def step_end(self, run, step, samples, timer):
        return self.signum is not None

    def epoch_end(self, run, record):
        return self.signum is not None

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        # Runs in the main thread once it is back in Python: the flag the loop reads.
        if self.signum is None:
            self.signum = signum
            if self._thread is None:
                self._first_at = time.monotonic()
        elif (self._thread is None and signum != signal.SIGHUP and self._exit
              and not _repeated(self._first_at)):  # no watcher: a second request ends it here
            raise KeyboardInterrupt

    def _watch(self):
        """Read the signals as they arrive, even while the main thread waits inside MXNet."""
        while True:
            try:
                data = self._sockets[0].recv(16)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in self._previous:
                    # Python writes a byte for every signal with a Python handler (SIGCHLD,
                    # SIGWINCH, ... of another library): not a request to stop.
                    continue
                if self._seen and _repeated(self._first_at):
                    continue  # one Ctrl-C delivered twice (a wrapper that forwards it)
                self._seen += 1
                if self._seen == 1:
                    self._first_at = time.monotonic()
                    if self.on_signal is not None:
                        _quietly(self.on_signal, signum)
                elif signum != signal.SIGHUP and self._exit:  # a closing session repeats SIGHUP
                    if self.on_second is not None:
                        _quietly(self.on_second, signum)
                    discard_unfinished()  # no half-written output left behind
                    os._exit(128 + signum)  # pylint: disable=protected-access

    def __enter__(self):
        self._exit = self.exit_on_second
        if self._exit is None:
            from .progress import jupyter_shell  # pylint: disable=import-outside-toplevel
            self._exit = jupyter_shell() is None
        for s in self.SIGNALS:
            if s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN:  # nohup
                self._previous[s] = signal.signal(s, self._handle)
        self._sockets = socket.socketpair()
        for sock in self._sockets:
            sock.setblocking(False)
        self._sockets[0].setblocking(True)
        self._wakeup = signal.set_wakeup_fd(self._sockets[1].fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name='stop-request', daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        _wait_out(self._first_at)  # a repeat of the first signal still finds this hook
        signal.set_wakeup_fd(self._wakeup)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._sockets[1].close()  # the watcher sees the end and returns
        self._thread.join(timeout=5)
        self._sockets[0].close()
        self._thread = None
        return False


def _interrupts_python(handler):
    """Whether ``handler`` (of SIGINT) is Python's default or a Jupyter kernel's.

    Python's raises ``KeyboardInterrupt``, as does the one IPython's kernel
    installs for a cell; for a cell with top-level ``await`` the kernel
    cancels the cell instead (a handler of ``ipykernel``).
    """
    if handler is signal.default_int_handler:
        return True
    return callable(handler) and getattr(handler, '__module__', '').startswith('ipykernel.')


def _quietly(say, signum):
    """Call ``say(signum)``; a terminal that is gone (EIO, EPIPE) must not end the watcher."""
    try:
        say(signum)
    except (OSError, ValueError):  # ValueError: the stream was closed
        pass


class StallGuard(Hook):
    """Calls ``on_stall`` when no training step has finished for a long time: a deadlock.

    MXNet's synchronised BatchNorm waits in a barrier without a time limit,
    and on CPU contexts it has been seen to wait forever (``sync_bn``); a
    process stuck there cannot be interrupted from Python. A thread of this
    guard checks, once a second, the time since the last step was queued
    (with steps in flight bounded, that is also the time since the step
    before it finished), from an epoch's first step until its steps are done;
    evaluation is not watched. Past ``max(seconds, factor x the longest step
    so far)`` it calls ``on_stall(seconds_waited)``, which should end the
    process. Use as a context manager (the thread ends with it), and only
    with steps in flight bounded: an unbounded loop legitimately waits a
    whole epoch at its end.
    """

    def __init__(self, on_stall, seconds=120.0, factor=20.0):
        self.on_stall, self.seconds, self.factor = on_stall, seconds, factor
        self._last = None  # when the last step was queued; None: not watching
        self._longest = 0.0
        self._done = threading.Event()
        self._thread = None

    def __enter__(self):
        self._thread = threading.Thread(target=self._watch, name='stall-guard', daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        return False

    def _watch(self):
        while not self._done.wait(1.0):
            last = self._last
            if last is None:
                continue
            waited = time.monotonic() - last
            if waited > max(self.seconds, self.factor * self._longest):
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


class Interruptible(Hook):
    """Ctrl-C (SIGINT) stops ``train`` after the current step, and never ends the process.

    What ``train`` and ``Training`` add unless a hook of the caller handles
    signals (the scripts bring ``StopRequest``): in a notebook, a Python
    session or a program of your own. During each ``fit`` the first SIGINT
    (Ctrl-C, a notebook's stop button, ``kill -INT``) is acknowledged with
    one line and asks the loop to stop after the step in progress; it then
    raises ``Interrupted`` (or, in the epoch's last step or evaluation, stops
    at that epoch's end), and ``fit()`` goes on from there. Further SIGINTs
    neither end the process nor raise ``KeyboardInterrupt`` in the middle of a
    step: they say that the run is still stopping (at most once a second); one
    within ``SAME_REQUEST`` seconds of the first is the same request also
    after ``fit`` has raised (the handler stays until then).

    The acknowledgement comes at once, even while the main thread waits
    inside MXNet for a long step: a thread reads the signal wake-up file
    descriptor (as ``StopRequest`` does; only SIGINT's bytes count), where no
    one else uses it (an event loop's stays theirs: the handler then speaks,
    once the step returns to Python). The handler is installed in ``enter``
    and the one before it (in a Jupyter kernel, the kernel's own, which raises
    ``KeyboardInterrupt`` in the cell) comes back in ``leave``, also when
    ``fit`` raises. It replaces only the handler that interrupts Python
    (``KeyboardInterrupt``: Python's own, or a Jupyter kernel's): a program
    that handles SIGINT itself (the scripts: their handlers unwind and clean
    up), ignores it (started in the background with it ignored) or handles it
    outside Python keeps its way. Nothing is installed outside the main
    thread (signals reach only it).

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
        self.say = say
        self.signum, self.requests = None, 0
        self._previous, self._installed, self._said, self._pending = None, False, None, []
        self._sockets = self._thread = None
        self._heard, self._first_at = 0, None

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        # Runs in the main thread between two bytecodes, possibly in the middle of a step:
        # it only notes the request (and says so without a watcher); it must never raise there.
        self.requests += 1
        if self.signum is None:
            self.signum = signum
            self._first_at = self._first_at or time.monotonic()
        if self._thread is None:
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

    def _watch(self, reader):
        """Acknowledge each SIGINT as it arrives, while the main thread waits inside MXNet."""
        while True:
            try:
                data = reader.recv(16)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum == signal.SIGINT:  # a byte of another signal with a Python handler
                    self._heard += 1       # (SIGCHLD, SIGWINCH, ...) is no request
                    self._first_at = self._first_at or time.monotonic()
                    self._acknowledge(self._heard)

    def _start_watching(self):
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            before = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            before = None
        if before != -1:  # taken (an event loop's): theirs stays, the handler speaks
            if before is not None:
                signal.set_wakeup_fd(before)
            reader.close()
            writer.close()
            return
        self._sockets, self._heard = (reader, writer), 0
        self._thread = threading.Thread(target=self._watch, args=(reader,),
                                        name='interruptible', daemon=True)
        self._thread.start()

    def _stop_watching(self):
        if self._thread is None:
            return
        reader, writer = self._sockets
        now = signal.set_wakeup_fd(-1)
        if now != writer.fileno():  # someone set theirs during the fit: it stays
            signal.set_wakeup_fd(now)
        writer.close()  # the watcher reads what is left, then sees the end
        self._thread.join(timeout=5)
        reader.close()
        self._sockets = self._thread = None

    def enter(self, run):
        self.signum, self.requests, self._said, self._pending = None, 0, None, []
        self._first_at = None
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if not _interrupts_python(previous):
            return  # a program's own handler, ignored, or outside Python: left as it is
        signal.signal(signal.SIGINT, self._handle)
        self._previous, self._installed = previous, True
        self._start_watching()

    def leave(self, run):
        if self._installed:
            self._installed = False
            try:
                _wait_out(self._first_at)  # a repeat of this SIGINT still finds the handler
                self._stop_watching()
            finally:
                signal.signal(signal.SIGINT, self._previous)
                self._previous = None
        self._flush()
        epochs = run.result.epochs if run.result is not None else []
        if self.signum is not None and epochs and epochs[-1].epoch >= run.num_epochs:
            _quietly(self.say, 'the interrupt came after the last step: the fit is complete')

    def step_end(self, run, step, samples, timer):
        if self._pending:
            self._flush()
        return self.signum is not None

    def epoch_end(self, run, record):
        return self.signum is not None

"""The signal rules every stop of the package follows: which signals, one request, its repeats.

The stop signals are SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal or the
ssh session closed); a SIGHUP that was ignored when a handler would be
installed (``nohup``) stays ignored (``install``). Three ways build on them:
``observe.stopping.StopRequest`` (the programs': stop after the current step, a
second signal ends the process), ``observe.interrupt.Interruptible`` (a
notebook's: Ctrl-C stops after the step, and never ends the process), and
``raising`` here (stop where the code is: the first signal raises
``errors.Interrupted`` in the main thread, which unwinds every ``with``
and ``finally`` on the way, and the signals after it are ignored, so that
they cannot break into the clean-up it started). A signal within ``SAME_REQUEST`` seconds of
the first is the same request (one Ctrl-C can arrive twice: a wrapper in the foreground group
that forwards signals delivers it again), and handlers go back only once it passed (``wait_out``).
"""
import contextlib
import ctypes
import functools
import os
import signal
import socket
import sys
import threading
import time

from ..errors import Interrupted

__all__ = ['STOP_SIGNALS', 'SAME_REQUEST', 'install', 'restore', 'ignore', 'raising',
           'WakeupReader', 'repeated', 'wait_out', 'interrupts_python', 'quietly',
           'on_parent_death', 'dying_with_parent']

#: The signals that stop a run: Ctrl-C, SIGTERM, and SIGHUP (the terminal or ssh session closed).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: Seconds after the first signal within which another is the same request (see above).
SAME_REQUEST = 0.5


def repeated(first_at):
    """Whether a signal arriving now repeats one that came at ``first_at`` (None: none came)."""
    return first_at is not None and time.monotonic() - first_at < SAME_REQUEST


def wait_out(first_at):
    """Return once the window of a signal that came at ``first_at`` has passed.

    Called with the hook's handlers still installed: a repeat that arrives
    meanwhile finds them, and is the same request.
    """
    while repeated(first_at):
        time.sleep(max(0.0, first_at + SAME_REQUEST - time.monotonic()))


def interrupts_python(handler):
    """Whether ``handler`` (of SIGINT) is Python's default or a Jupyter kernel's.

    Python's raises ``KeyboardInterrupt``, as does the one IPython's kernel
    installs for a cell; for a cell with top-level ``await`` the kernel
    cancels the cell instead (a handler of ``ipykernel``).
    """
    return handler is signal.default_int_handler or (
        callable(handler) and getattr(handler, '__module__', '').startswith('ipykernel.'))


def quietly(say, signum):
    """Call ``say(signum)``; a terminal that is gone (EIO, EPIPE) must not end the watcher."""
    with contextlib.suppress(OSError, ValueError):  # ValueError: the stream was closed
        say(signum)


def install(handler, signums=STOP_SIGNALS, nohup=True):
    """Make ``handler`` the handler of each of ``signums``; return ``{signum: previous}``.

    The one place of the package that sets a signal's handler. A SIGHUP ignored now
    (``nohup``) stays ignored and is left out, unless ``nohup`` is False. Main thread only.
    """
    return {s: signal.signal(s, handler) for s in signums
            if not nohup or s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN}


def restore(previous):
    """Put back the handlers ``install`` returned."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def ignore(signums=STOP_SIGNALS):
    """Ignore ``signums`` from now on: a program that has stopped and only ends; SIGXFSZ, so
    that a write past a file-size limit fails (EFBIG) instead of killing the process."""
    install(signal.SIG_IGN, signums, nohup=False)


class raising:  # pylint: disable=invalid-name
    """Context manager (main thread): the first stop signal raises ``Interrupted`` where the
    code is; those after it are ignored; the previous handlers come back on exit.

    Python runs the handler between bytecodes, so a wait inside MXNet ends
    first (a step, a synchronisation). ``signum`` is the first signal
    received, or None; ``signums``: the signals handled (default ``STOP_SIGNALS``).

    Where Python swallows an exception (a ``__del__``, a weakref callback, a
    function run after ``fork``) the raise cannot unwind anything: Python
    reports it as unraisable instead, and then the signal is sent again, so
    that the next bytecode outside such a place raises it; no stop is lost.
    """

    def __init__(self, signums=STOP_SIGNALS):
        self.signums, self.signum, self._previous = tuple(signums), None, {}
        self._unraisable, self._reporting = None, False

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        if self._reporting:  # inside the report of a swallowed stop: it would be swallowed too
            self._send_later(signum)
        elif self.signum is None:
            self.signum = signum
            raise Interrupted.by_signal(signum)

    @staticmethod
    def _send_later(signum):
        # From another thread, a moment later: sent from here, the handler would run here.
        threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()

    def _swallowed(self, unraisable):
        if not isinstance(unraisable.exc_value, Interrupted) or self.signum is None:
            return self._unraisable(unraisable)
        self._reporting = True
        signum, self.signum = self.signum, None
        self._send_later(signum)  # the main thread raises it again, outside the swallowing place
        self._reporting = False
        return None

    def __enter__(self):
        self._previous = install(self._handle, self.signums)
        self._unraisable, sys.unraisablehook = sys.unraisablehook, self._swallowed
        return self

    def __exit__(self, *exc):
        restore(self._previous)
        sys.unraisablehook = self._unraisable


class WakeupReader:
    """Hear signals at once, even while the main thread waits inside MXNet: a thread reads the
    signal wake-up file descriptor and calls ``on_signal(signum)`` for each of ``signums``.

    Python runs a handler only between bytecodes of the main thread, and a
    training step waits inside MXNet for seconds; but for every signal that
    has a Python handler it also writes the signal's number to the wake-up
    descriptor at once. Only the bytes of ``signums`` count (SIGCHLD,
    SIGWINCH, ... of another library's handlers are no request).
    ``start(only_if_free=True)`` leaves a descriptor someone set (an event
    loop's) as it is, and then hears nothing; ``stop`` puts back the one
    there before, unless someone set theirs meanwhile (it stays). Main thread only.
    """

    def __init__(self, signums, on_signal, name='signals'):
        self.signums, self.on_signal, self.name = frozenset(signums), on_signal, name
        self._sockets = self._thread = self._before = None
        #: Wake-up bytes read and answered so far, every signal's (counted after its
        #: ``on_signal``): what a caller waits on to know the thread has seen a signal.
        self.bytes_read = 0

    @property
    def reading(self):
        """Whether the thread reads the descriptor now."""
        return self._thread is not None

    def start(self, only_if_free=False):
        """Take the descriptor and start the thread; False where it was not taken."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        before = None
        with contextlib.suppress(ValueError, OSError):  # not the main thread, or none can be set
            before = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if before is None or (only_if_free and before != -1):
            if before is not None:
                signal.set_wakeup_fd(before)  # theirs stays
            reader.close()
            writer.close()
            return False
        self._sockets, self._before = (reader, writer), before
        self._thread = threading.Thread(target=self._read, args=(reader,), name=self.name,
                                        daemon=True)
        self._thread.start()
        return True

    def stop(self):
        """Put the descriptor back and end the thread (it reads what is left first)."""
        if self._thread is None:
            return
        reader, writer = self._sockets
        if (now := signal.set_wakeup_fd(self._before)) != writer.fileno():
            signal.set_wakeup_fd(now)  # someone set theirs meanwhile: it stays
        writer.close()  # the thread reads what is left, then sees the end
        self._thread.join(timeout=5)
        reader.close()
        self._sockets = self._thread = self._before = None

    def _read(self, reader):
        with contextlib.suppress(OSError):  # a failing recv ends the thread, as the end does
            while data := reader.recv(16):
                for signum in data:
                    if signum in self.signums:
                        self.on_signal(signum)
                    self.bytes_read += 1


# -- no process outlives its job ----------------------------------------------------------------
# Every child a program of the package starts (the doctor's probe, the launcher's agents, an
# agent's keeper's command, the lab's runs) asks the kernel, before its program runs, for a
# signal when its parent dies, however the parent dies (SIGKILL included).

_PR_SET_PDEATHSIG = 1


@functools.lru_cache(maxsize=None)
def _prctl():
    """libc's ``prctl`` (None where there is none), looked up once in the parent: a child
    between fork and exec only calls it."""
    with contextlib.suppress(OSError, AttributeError):  # no libc with prctl: not Linux
        return ctypes.CDLL(None).prctl
    return None


def on_parent_death(signum):
    """In a child before it runs its program: ``signum`` when its parent dies (Linux's
    ``PR_SET_PDEATHSIG``; nothing where there is none)."""
    if (prctl := _prctl()) is not None:
        prctl(_PR_SET_PDEATHSIG, int(signum))


def dying_with_parent(signum=signal.SIGKILL, first=None):
    """A ``preexec_fn`` for ``subprocess``: the child calls ``first`` (if given), then asks for
    ``signum`` when this process, its parent, dies; if its parent died already (between the
    fork and the request, which the kernel would not report), it ends at once (SIGKILL:
    nothing of it has run yet)."""
    parent, _ = os.getpid(), _prctl()

    def preexec():
        if first is not None:
            first()
        on_parent_death(signum)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec

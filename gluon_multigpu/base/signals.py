"""The signal rules every stop of the package follows: one request, its repeats, Python's handler.

A signal within ``SAME_REQUEST`` seconds of the first is the same request, not a
second one (one Ctrl-C can arrive several times within milliseconds: the
terminal sends SIGINT to the whole foreground process group, and a wrapper in
it that forwards signals to its child delivers it again). A hook or a program
hands its handlers back only once that window has passed (``wait_out``), so a
repeat never reaches the handler that was there before. ``run.stopping``,
``core.interrupt`` and the programs' stops (``cli.common``) build on these.
"""
import signal
import time

__all__ = ['SAME_REQUEST', 'repeated', 'wait_out', 'interrupts_python', 'quietly']

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
    if handler is signal.default_int_handler:
        return True
    return callable(handler) and getattr(handler, '__module__', '').startswith('ipykernel.')


def quietly(say, signum):
    """Call ``say(signum)``; a terminal that is gone (EIO, EPIPE) must not end the watcher."""
    try:
        say(signum)
    except (OSError, ValueError):  # ValueError: the stream was closed
        pass

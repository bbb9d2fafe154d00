"""Every thread's Python stack, written by ``faulthandler``: at once, or when a signal asks.

A run whose steps stopped (``observe.stall``) says where each thread waits:
``dump`` writes the stacks now, from any thread; ``dump_on_signal`` makes
``DUMP_SIGNAL`` write them, from the signal handler in C, so also while the
main thread waits inside MXNet. A launched job's agent sends that signal to
the processes of its command that asked for it (``send_dump``: a process
that did not would end on it). The stacks go to standard error, or to the
process's own when ``sys.stderr`` has no descriptor (a notebook's).
"""
import contextlib
import faulthandler
import os
import signal
import sys

__all__ = ['DUMP_SIGNAL', 'dump', 'dump_on_signal', 'send_dump', 'catches']

#: The signal on which a launched job's worker writes its stacks to its log.
DUMP_SIGNAL = signal.SIGUSR1


def _stream():
    """Standard error if it has a descriptor, else the process's own (None if neither has)."""
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.flush()
            stream.fileno()
            return stream
    return None


def dump():
    """Write every thread's Python stack to standard error now (nothing where there is none)."""
    if (stream := _stream()) is not None:
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()


def dump_on_signal():
    """Make ``DUMP_SIGNAL`` write every thread's Python stack to standard error (this process)."""
    if (stream := _stream()) is not None:
        # faulthandler re-installs its handler only if it thinks it has none: after another
        # handler replaced it (``signal.signal``), a second ``register`` alone would not.
        faulthandler.unregister(DUMP_SIGNAL)
        faulthandler.register(DUMP_SIGNAL, file=stream, all_threads=True)


def catches(pid, signum):
    """Whether process ``pid`` handles ``signum`` itself (``SigCgt`` in /proc; False if gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError), \
            open(f'/proc/{pid}/status', encoding='ascii') as f:
        for line in f:
            if line.startswith('SigCgt:'):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def send_dump(pids):
    """Send ``DUMP_SIGNAL`` to each of ``pids`` that handles it (one that is gone is skipped)."""
    for pid in (pid for pid in pids if catches(pid, DUMP_SIGNAL)):
        with contextlib.suppress(OSError):
            os.kill(pid, DUMP_SIGNAL)

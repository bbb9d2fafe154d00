"""Work on a thread of its own for as long as a ``with`` block runs.

A stall guard's watch, the load another job puts on a device, a sampler of
the machine's other processes: each is a loop on a daemon thread that starts
with the block and ends with it. ``Background`` is that context manager once:
a subclass writes the loop (``work``), which returns once ``finished`` is set.
"""
import functools
import threading

__all__ = ['Background']


class Background:
    """Context manager: ``work()`` runs on a daemon thread while the block runs.

    ``work`` must return soon after ``finished`` (a ``threading.Event``) is
    set, e.g. ``while not self.finished.wait(interval): ...``; the exit sets it
    and waits for the thread. ``thread_name`` names the thread (for a dump
    of the threads). A subclass that does more on entry or exit calls these.
    """

    thread_name = None

    def work(self):
        """The loop of the thread; returns once ``finished`` is set."""
        raise NotImplementedError

    @functools.cached_property
    def finished(self):
        """Set when the block has ended: ``work`` returns."""
        return threading.Event()

    def __enter__(self):
        self.finished.clear()
        # pylint: disable-next=attribute-defined-outside-init
        self._thread = threading.Thread(target=self.work, name=self.thread_name, daemon=True)

        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.finished.set()
        self._thread.join()

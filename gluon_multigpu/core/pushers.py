"""One Python thread per device that queues that device's share of a step.

MXNet keeps its scratch copies (``MXNET_CPU_TEMP_COPY``) per Python thread,
and every CPU context draws from the pool of the thread that queued its
operators. Queued from one thread, two contexts share one pool and wait for
each other on the copies they happen to share (hence MXNet's default of 4
ran two contexts at about half the speed, and a widened pool of 128 copies
cost 1.6 GB). Queued from a thread of their own, each context has its own
pool: measured on ResNet-18, batch 128, two CPU contexts, MXNet's 4 copies,
1.14 times the images/s of one thread with 128 copies at 0.53 times its
peak memory (docs/results.md).

The threads live as long as the ``DevicePushers`` that made them; each turns
on the NumPy semantics for itself (MXNet keeps them per thread). A network's
first call compiles it and must not happen in two threads at once: the
caller runs the first step itself (``Training`` does).
"""
import queue
import threading

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

__all__ = ['DevicePushers']

_STOP = object()


class _Pusher(threading.Thread):
    """A thread that runs the calls it is given, one at a time, and hands back each result."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.calls, self.results = queue.Queue(), queue.Queue()
        self.start()

    def run(self):
        npx.set_np()
        while True:
            call = self.calls.get()
            if call is _STOP:
                return
            try:
                self.results.put((True, call()))
            except BaseException as e:  # pylint: disable=broad-except  (handed to the caller)
                self.results.put((False, e))


class DevicePushers:
    """A thread per device: ``run(calls)`` runs ``calls[i]`` in thread ``i`` and returns their
    results in order, raising the first error once every call has ended."""

    def __init__(self, devices):
        self.threads = [_Pusher(f'push-{d}') for d in devices]
        self.ready = False  # set once the network has been called (compiled) in the caller

    def run(self, calls):
        """Run each of ``calls`` (one per device) in its device's thread; return the results."""
        for thread, call in zip(self.threads, calls):
            thread.calls.put(call)
        done = [thread.results.get() for thread in self.threads[:len(calls)]]
        for ok, value in done:
            if not ok:
                raise value
        return [value for _, value in done]

    def close(self):
        """End the threads (each after its call in progress)."""
        for thread in self.threads:
            thread.calls.put(_STOP)
        for thread in self.threads:
            thread.join()
        self.threads = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

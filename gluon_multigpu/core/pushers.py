"""One Python thread per device that queues that device's share of a step.

MXNet keeps its scratch copies (``MXNET_CPU_TEMP_COPY``) per Python thread,
and every CPU context draws from the pool of the thread that queued its
operators. Queued from one thread, two contexts share one pool and wait for
each other on the copies they happen to share (with MXNet's 4, ResNet-18 on
two contexts trained at about half the images/s; a pool widened to 128
copies made up the speed and cost 1.6 GB). Queued from a thread of their
own, each context has its own pool, and MXNet's 4 copies serve it: one
context runs one operator at a time (docs/results.md, "Memory").

The threads live as long as the ``DevicePushers`` that made them; each turns
on the NumPy semantics for itself (MXNet keeps them per thread), and reads
``MXNET_CPU_TEMP_COPY`` at its first operator, so the pools are the size the
environment says when the threads start, whenever MXNet was loaded. A
network's first call of a kind (training, evaluation) builds its graph and
must not happen in two threads at once: ``run`` makes that call in the
caller's thread, one device after the other, and the later ones in the
devices' threads.
"""
import queue
import threading

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

__all__ = ['DevicePushers', 'pushers_for']

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
    """A thread per device: ``run(calls, kind)`` runs ``calls[i]`` in thread ``i`` and returns
    their results in order, raising the first error once every call has ended."""

    def __init__(self, devices):
        self.threads = [_Pusher(f'push-{d}') for d in devices]
        self.warm = set()  # the kinds of call already made once (in the caller's thread)

    def run(self, calls, kind):
        """Run each of ``calls`` (one per device, at most one per thread) in its device's
        thread; return the results. The first run of a ``kind`` runs them here, in order."""
        if kind not in self.warm:
            results = [call() for call in calls]  # builds the graphs: one thread at a time
            self.warm.add(kind)
            return results
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


class _Nothing:
    """``pushers_for``'s answer where one thread queues everything: enters as None."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def pushers_for(devices):
    """A ``DevicePushers`` for several CPU contexts (each its own scratch copies), to use
    in a ``with``; for one device or GPUs, a context that gives None (one thread serves)."""
    if len(devices) > 1 and all(d.device_type == 'cpu' for d in devices):
        return DevicePushers(devices)
    return _Nothing()

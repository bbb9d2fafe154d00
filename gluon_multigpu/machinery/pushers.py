"""One Python thread per device that queues that device's share of a step.

MXNet keeps its scratch copies (``MXNET_CPU_TEMP_COPY``) per Python thread,
and every CPU context draws from the pool of the thread that queued its
operators. Queued from one thread, two contexts share one pool and wait for
each other on the copies they happen to share (with MXNet's 4, ResNet-18 on
two contexts trained at about half the images/s; a pool widened to 128
copies made up the speed and cost 1.6 GB). Queued from a thread of their
own, each context has its own pool, and one copy serves it (``engine``'s
plan for CPU contexts): one context runs one operator at a time
(docs/results.md, "Memory"). Each device's thread is the process's, made at
its first use and kept, since MXNet frees a thread's copies only when the
process ends; its calls run one at a time. A network's first call of a kind
builds its graph, so ``run`` makes it in the caller's thread, device by device.
"""
import contextlib
import os
import queue
import threading
from concurrent.futures import Future, wait

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import npx

__all__ = ['DevicePushers', 'pushers_for', 'device_thread']


class _Pusher(threading.Thread):
    """A device's thread: runs the calls it is given, one at a time, each result to its Future."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.calls = queue.SimpleQueue()
        self.start()

    def run(self):
        npx.set_np()
        while True:
            call, future = self.calls.get()
            try:
                future.set_result(call())
            except BaseException as e:  # pylint: disable=broad-except  (handed to the caller)
                future.set_exception(e)
            # An idle thread holds nothing of the call: its closure holds a training's network
            call = future = None

    def submit(self, call):
        future = Future()
        self.calls.put((call, future))
        return future


_THREADS, _LOCK = {}, threading.Lock()


def device_thread(device):
    """The process's thread for ``device`` (made at the first call, then the same one)."""
    name = f'push-{device}'
    with _LOCK:
        if name not in _THREADS:
            _THREADS[name] = _Pusher(name)
        return _THREADS[name]


os.register_at_fork(after_in_child=_THREADS.clear)  # a forked child: none of its parent's threads


class DevicePushers:
    """Each device's thread: ``run(calls, kind)`` runs ``calls[i]`` in device ``i``'s thread and
    returns their results in order, raising the first error once every call has ended."""

    def __init__(self, devices):
        self.threads = [device_thread(d) for d in devices]
        self.warm = set()  # the kinds of call already made once (in the caller's thread)

    def run(self, calls, kind):
        """Run each of ``calls`` (one per device, at most one per thread) in its device's
        thread; return the results. The first run of a ``kind`` runs them here, in order."""
        if kind not in self.warm:
            results = [call() for call in calls]  # builds the graphs: one thread at a time
            self.warm.add(kind)
            return results
        futures = [thread.submit(call) for thread, call in zip(self.threads, calls)]
        wait(futures)  # every call has ended before the first error (in order) is raised
        return [f.result() for f in futures]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Nothing to end: the threads are the process's, kept for the next training."""


def pushers_for(devices):
    """A ``DevicePushers`` for several CPU contexts (each its own scratch copies), to use
    in a ``with``; for one device or GPUs, a context that gives None (one thread serves)."""
    several_cpus = len(devices) > 1 and all(d.device_type == 'cpu' for d in devices)
    return DevicePushers(devices) if several_cpus else contextlib.nullcontext()

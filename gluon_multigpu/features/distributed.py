"""Training across machines on MXNet's parameter server: each worker its share of every batch.

MXNet's ``dist_sync``, ``dist_device_sync`` and ``dist_async`` kvstores (the
ps-lite parameter server compiled into the pip build) connect the processes
that ``scripts/launch.py`` starts: a scheduler, servers that hold the summed
gradients (or, asynchronously, the weights), and workers, each training on
its own devices as on one machine. A worker reads its share of every global
batch of a shuffled epoch (``WorkerShard``): the workers' shares of one step
together are exactly the batch a single process would draw with the same
seed, so a synchronous run on W workers equals one process on all their
devices.
"""
import contextlib
import os
import select
import signal
import threading
import time
from concurrent.futures import Future, wait
from typing import NamedTuple

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx

from ..base import stacks
from ..base.protocol import control_fds
from ..section.data import ArrayLoader
from ..errors import GluonMultiGPUError, Interrupted
from ..section.kvstores import DIST_KVSTORES, kvstore_name
from ..observe.stall import StepReports
from ..machinery.training import Hook

__all__ = ['DIST_KVSTORES', 'DMLC_VARIABLES', 'Worker', 'join', 'connect', 'JoinError',
           'JOIN_TIMEOUT', 'Control', 'WorkerShard', 'StepScale', 'step_scale']

#: The variables a parameter-server worker needs (``scripts/launch.py`` sets them).
DMLC_VARIABLES = ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT', 'DMLC_NUM_SERVER',
                  'DMLC_NUM_WORKER')
#: Seconds a worker waits to join the parameter server (``GLUON_MULTIGPU_JOIN_TIMEOUT`` sets it).
JOIN_TIMEOUT = 120.0


class JoinError(GluonMultiGPUError):
    """The parameter server could not be joined in time.

    MXNet's join cannot be called off: the thread that waits in it stays
    blocked, so a program should end its process (``os._exit``) after saying so;
    likewise after an ``Interrupted`` whose ``joining`` is true (a stop asked during the wait).
    """


class Worker(NamedTuple):
    """This process's place in a parameter-server run (rank 0 of 1 on one machine).

    ``kvstore`` is the parameter server's kvstore (None on one machine).
    """
    kvstore: object = None
    rank: int = 0
    count: int = 1

    def describe(self, batch_size):
        """The batch as a run's header line states it: per worker and global, with workers."""
        return '' if self.count == 1 else (
            f' per worker x {self.count} workers = global batch {batch_size * self.count}, '
            f'kvstore {self.kvstore.type}, worker rank {self.rank}')

    def shard(self, train_iter, test_iter, seed=0):
        """This worker's ``(train_iter, test_iter)`` from the whole data set's loaders.

        It trains on its share of every global batch (``WorkerShard`` of
        ``train_iter``'s samples and batch size) and, unless it is the first,
        does not evaluate (``test_iter`` None). On one machine: as given.
        """
        return (train_iter, test_iter) if self.count == 1 else (
            WorkerShard(train_iter.images, train_iter.labels, train_iter.batch_size, self.rank,
                        self.count, seed), None if self.rank else test_iter)


def join(kvstores, start=None, environ=None, stop=None, timeout=None):
    """Join the parameter server if one of ``kvstores`` (names) is one; return this ``Worker``.

    Without a parameter-server kvstore: ``Worker()``, rank 0 of 1. With one,
    it must be the only kvstore, and the process must have been started as a
    worker by the launcher (the ``DMLC_VARIABLES`` set, ``DMLC_ROLE=worker``);
    ``start`` says in the message how to start it so. Blocks until every
    worker has joined (see ``connect`` for ``stop`` and ``timeout``). Under
    ``launch`` the worker then reports its rank to the launcher.
    """
    dist = [k for k in kvstores if k in DIST_KVSTORES]
    if not dist:
        return Worker()
    if len(kvstores) > 1:
        raise GluonMultiGPUError(f'`kvstore` {dist[0]} trains across machines; give it alone, '
                                 'not with other kvstores')
    environ = os.environ if environ is None else environ
    missing = [v for v in DMLC_VARIABLES if not environ.get(v)]
    if missing or environ.get('DMLC_ROLE') != 'worker':
        start = start or 'python scripts/launch.py -n WORKERS -s SERVERS -- python YOUR_PROGRAM.py'
        raise GluonMultiGPUError(
            f'`kvstore` {dist[0]} runs as a worker of a parameter server, and '
            f'{", ".join(missing) or "DMLC_ROLE=worker"} is not set; start it with: {start}')
    kv = connect(dist[0], stop=stop, timeout=timeout, environ=environ)
    if (control := Control.from_environment(environ)) is not None:
        control.report(f'rank {kv.rank} {kv.num_workers}')
    return Worker(kv, kv.rank, kv.num_workers)


def connect(name, stop=None, timeout=None, environ=None):
    """Join the parameter server as a worker; return the kvstore (``.rank``, ``.num_workers``).

    The process must have been started with the DMLC_* variables of a worker
    (``scripts/launch.py`` sets them); MXNet reads them here. MXNet waits for
    the scheduler and every other process without a bound and cannot be
    interrupted there, so the wait runs in a thread: ``Interrupted`` (``joining``) when
    ``stop()`` (a ``StopRequest``) turns true, ``JoinError`` after ``timeout`` seconds
    (default ``GLUON_MULTIGPU_JOIN_TIMEOUT``, else ``JOIN_TIMEOUT``).
    """
    if name not in DIST_KVSTORES:
        raise GluonMultiGPUError(f'{name!r} is not a parameter-server kvstore; choose one of '
                                 f'{", ".join(DIST_KVSTORES)}')
    environ = os.environ if environ is None else environ
    if timeout is None:
        timeout = float(environ.get('GLUON_MULTIGPU_JOIN_TIMEOUT') or JOIN_TIMEOUT)
    where = f"{environ.get('DMLC_PS_ROOT_URI')}:{environ.get('DMLC_PS_ROOT_PORT')}"
    created = Future()

    def create():
        try:
            created.set_result(mx.kv.create(name))
        except Exception as e:  # pylint: disable=broad-except  (raised by ``result`` below)
            created.set_exception(e)
    threading.Thread(target=create, name='join-parameter-server', daemon=True).start()
    deadline = time.monotonic() + timeout
    while not wait([created], 0.1).done:
        if stop is not None and stop():
            signum = getattr(stop, 'signum', None) or signal.SIGINT
            raise Interrupted(signum=signum, joining=True, message=(
                f'interrupted by {signal.Signals(signum).name} while joining the parameter '
                f'server at {where}: nothing was trained'))
        if time.monotonic() > deadline:
            raise JoinError(f'could not join the parameter server at {where} within {timeout:g} '
                            's: the scheduler is not reachable from this host, or not every '
                            'worker and server started; check the launcher\'s other lines (set '
                            'GLUON_MULTIGPU_JOIN_TIMEOUT to wait longer)')
    return created.result()


class Control(StepReports):
    """The launcher's line to one of its workers (``launch``, through ``multihost.agent``).

    The worker reports its rank once joined and its steps (``StepReports``: the
    launcher watches them for a stall). A synchronous run must end on one step
    everywhere (its first worker writes that step's checkpoint), so the launcher
    stops a job by agreement. Asked (``stop-ask``), the worker says the step it
    holds at (``held N``) and waits there; asked again, it goes on one step and
    holds again; told ``stop-at S`` (the largest step held), it goes on to step
    S and stops: ``stop`` (a ``StopRequest``) is marked as stopped by
    SIGTERM and ``on_stop`` says so. A signal to the worker ends a hold. Made
    from the ``CONTROL_VARIABLE`` the agent sets (``from_environment``), which
    also makes ``stacks.DUMP_SIGNAL`` write the stacks; nothing outside a
    launched job.

    Parameters
    ----------
    read_fd, write_fd : int
        The control pipes from and to the agent (``GLUON_MULTIGPU_CONTROL``).
    stop : observe.stopping.StopRequest, optional
        Marked as stopped by SIGTERM when step S is reached.
    on_stop : callable, optional
        Called with S when step S is reached, once.
    """

    def __init__(self, read_fd, write_fd, stop=None, on_stop=None):
        super().__init__(write_fd)
        self.stop_at, self.stop, self.on_stop = None, stop, on_stop
        self._read_fd, self._said, self._pending = read_fd, False, b''
        self._asks, self._closed = 0, False
        # Read between steps, never by a thread: a thread blocked in a read when the process
        # exits makes MXNet's parameter server end it with "terminate called" (SIGABRT).
        os.set_blocking(read_fd, False)

    @classmethod
    def from_environment(cls, environ=None, **kw):
        """The ``Control`` of this process if a launcher's agent started it, else None."""
        global _CONTROL  # pylint: disable=global-statement
        if _CONTROL is None:
            if (fds := control_fds(environ)) is None:
                return None
            _CONTROL = cls(*fds)
            stacks.dump_on_signal()  # the launcher asks for the stacks of a hung job
        for k, v in kw.items():
            setattr(_CONTROL, k, v)
        return _CONTROL

    def _listen(self, wait=0.0):
        """Take in the launcher's lines that have come, after waiting up to ``wait`` seconds
        for one."""
        if wait:
            select.select([self._read_fd], [], [], wait)
        with contextlib.suppress(OSError):  # BlockingIOError: nothing more has come
            while data := os.read(self._read_fd, 4096):
                *lines, self._pending = (self._pending + data).split(b'\n')
                for words in map(bytes.split, lines):
                    if words == [b'stop-ask']:
                        self._asks += 1
                    elif len(words) == 2 and words[0] == b'stop-at' and words[1].isdigit():
                        self.stop_at = int(words[1])
            self._closed = True  # the agent's end is closed: no answer can come

    def _reached(self):
        self._listen()
        if (asks := self._asks) and self.stop_at is None:  # hold here until told what next
            self.report(f'held {self.steps}')
            while not (self.stop_at is not None or self._asks > asks or self._closed
                       or getattr(self.stop, 'signum', None) is not None):
                self._listen(0.1)
        if self.stop_at is None or self.steps < self.stop_at:
            return False
        if not self._said:
            self._said = True
            if self.stop is not None and getattr(self.stop, 'signum', 1) is None:
                self.stop.signum = signal.SIGTERM
            if self.on_stop is not None:
                self.on_stop(self.stop_at)
        return True

    def step_end(self, run, step, samples, timer):
        super().step_end(run, step, samples, timer)
        return self._reached()

    def epoch_end(self, run, record):
        super().epoch_end(run, record)
        return self._reached()


_CONTROL = None


def step_scale(kvstore, num_workers):
    """What a worker multiplies its batch size by for ``trainer.step``.

    Synchronous kvstores hand every worker the sum over all workers'
    gradients, so the step normalises by the global batch (``num_workers``);
    ``dist_async`` applies each worker's own gradient, normalised by its batch.
    """
    return 1 if kvstore_name(kvstore) == 'dist_async' else num_workers


class StepScale(Hook):
    """A plug-in of ``train`` for a worker of a parameter server: how ``trainer.step`` normalises.

    ``hooks=[StepScale(kvstore, num_workers)]`` sets ``run.step_scale`` to
    ``step_scale(kvstore, num_workers)``.
    """

    def __init__(self, kvstore, num_workers):
        self.scale = step_scale(kvstore, num_workers)

    def setup(self, run):
        run.step_scale = self.scale


class WorkerShard(ArrayLoader):
    """The training batches of worker ``rank`` of ``num_workers``: its share of each global batch.

    Epoch ``e`` shuffles all samples with ``(seed, e)`` as ``ArrayLoader``
    does, cuts the order into global batches of ``batch_size * num_workers``
    (a last, incomplete one is dropped, so every worker takes the same number
    of steps), and gives worker ``rank`` the samples ``[rank * batch_size,
    (rank + 1) * batch_size)`` of each. Every sample of an epoch goes to at
    most one worker, in the order one process would see it.

    Parameters
    ----------
    images, labels : numpy.ndarray
        The whole training set: ``uint8 (N, H, W)`` and ``int32 (N,)``.
    batch_size : int
        Samples per step on this worker (over its devices).
    rank, num_workers : int
        This worker's place, from 0, and the workers of the job.
    seed : int
        Seed of the shuffling, the same on every worker.
    """

    def __init__(self, images, labels, batch_size, rank, num_workers, seed=0):
        if not 0 <= rank < num_workers:
            raise GluonMultiGPUError(f'worker rank {rank} is not within 0..{num_workers - 1}')
        super().__init__(images, labels, batch_size, shuffle=True, seed=seed, last_batch='discard')
        self.rank, self.num_workers = rank, num_workers
        if len(self) == 0:
            raise GluonMultiGPUError(
                f'{len(labels)} training images make no global batch of {batch_size} x '
                f'{num_workers} workers; use a smaller `batch_size` or more images')

    def __len__(self):
        return len(self.labels) // (self.batch_size * self.num_workers)

    @property
    def num_samples(self):
        """Samples this worker sees per epoch."""
        return len(self) * self.batch_size

    def batches_of(self, epoch):
        """This worker's batches of ``epoch`` (counted from 0)."""
        order, size, step = self.order(epoch), self.batch_size, self.batch_size * self.num_workers
        for start in range(self.rank * size, len(self) * step, step):  # rank * size < step
            yield self._to_batch(order[start:start + size])

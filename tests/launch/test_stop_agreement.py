"""The launcher's coordinated stop: every worker of a synchronous job stops after the same step.

The workers here are the real ``distributed.Control`` and the launcher the real
``supervise.Job``, joined by pipes in place of the agents, with a delay on one
worker's line: the way a loaded machine delays a relay. Each simulated worker
steps as a synchronous one with one step in flight does (``section.steps``): it
can finish step k only once every other worker has queued step k - 1, and it
hears the launcher only between steps.
"""
import os
import threading
import time
from types import SimpleNamespace

import pytest

from gluon_multigpu.features.distributed import Control
from gluon_multigpu.multihost import plan, supervise


def lines(fd):
    """The lines a ``Control`` writes on ``fd``, as they come (a generator; EOF ends it)."""
    with os.fdopen(fd, 'rb') as f:
        for line in f:
            yield line.decode().split()


def hold_in_thread(control):
    """``control.step_end`` in a thread (it may hold); the thread and the list its answer
    goes to."""
    answer = []
    t = threading.Thread(target=lambda: answer.append(control.step_end(None, 0, 0, None)),
                         daemon=True)  # (a failed test leaves no thread holding the process)
    t.start()
    return t, answer


def test_a_worker_asked_to_stop_holds_says_its_step_and_goes_on_only_as_told():
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    stopped = []
    control = Control(to_r, from_w, stop=SimpleNamespace(signum=None), on_stop=stopped.append)
    said = lines(from_r)
    for n in (1, 2):
        assert control.step_end(None, 0, 0, None) is False and next(said) == ['step', str(n)]
    os.write(to_w, b'stop-ask\n')
    t, answer = hold_in_thread(control)
    assert next(said) == ['step', '3'] and next(said) == ['held', '3']
    t.join(0.5)
    assert t.is_alive() and not answer  # holding: no step until the launcher says
    os.write(to_w, b'stop-ask\n')  # asked again while holding
    t.join(5)
    assert answer == [False]  # one step on, ...
    t, answer = hold_in_thread(control)
    assert next(said) == ['step', '4'] and next(said) == ['held', '4']  # ... then held again
    os.write(to_w, b'stop-at 5\n')
    t.join(5)
    assert answer == [False] and not stopped  # behind the common step: on to it
    assert control.step_end(None, 0, 0, None) is True and stopped == [5]
    assert next(said) == ['step', '5']
    assert control.stop.signum is not None  # the run stops as on SIGTERM (its checkpoint kept)
    # A signal to the worker ends a hold (the launcher's SIGTERM after its grace period)
    control = Control(*os.pipe()[:1], from_w, stop=SimpleNamespace(signum=None))
    control._asks = 1
    t, answer = hold_in_thread(control)
    assert next(said) == ['step', '1'] and next(said) == ['held', '1']  # holding
    control.stop.signum = 15
    t.join(5)
    assert answer == [False] and not t.is_alive()


class SimulatedWorker:
    """A worker of a synchronous job: ``Control`` hearing the launcher ``delay`` seconds late."""

    kind, lost, hung, stopped_since = 'worker', None, None, None

    def __init__(self, index, step_time, delay):
        self.index, self.step_time, self.delay = index, step_time, delay
        self.held, self.steps, self.heard, self.stopped_at, self.peers = None, 0, 0.0, None, []
        to_r, self._to_w = os.pipe()
        from_r, from_w = os.pipe()
        self.control = Control(to_r, from_w, stop=SimpleNamespace(signum=None))
        self.done = threading.Event()
        threading.Thread(target=self._relay, args=(from_r,), daemon=True).start()
        threading.Thread(target=self._work, daemon=True).start()

    def _relay(self, fd):
        for words in lines(fd):
            plan._take_control(self, words)  # pylint: disable=protected-access

    def send(self, line):
        self.heard = time.monotonic()
        if line != 'ping':
            threading.Timer(self.delay, os.write, (self._to_w, (line + '\n').encode())).start()

    def running(self):
        return not self.done.is_set()

    def _work(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            # finishing step k needs every worker's gradients of step k - 1
            if all(p.control.steps >= self.control.steps for p in self.peers):
                time.sleep(self.step_time)
                if self.control.step_end(None, 0, 0, None):
                    self.stopped_at = self.control.steps
                    break
                if self.control.stop.signum:  # the run's StopRequest would stop it here
                    break
            else:
                time.sleep(0.005)
        self.done.set()


def job_of(workers, grace):
    """The launcher's ``Job`` of ``workers``, once every one of them has taken 3 steps."""
    for w in workers:
        w.peers = [p for p in workers if p is not w]
    deadline = time.monotonic() + 60
    while min(w.control.steps for w in workers) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    return supervise.Job(plan.Settings(num_workers=len(workers), grace=grace), workers, [],
                         words=None)


@pytest.mark.parametrize('delays', [(0.0, 0.6), (0.6, 0.0), (0.3, 0.3, 0.0)])
def test_every_worker_stops_after_one_step_though_one_hears_late(delays):
    # the worker that hears late is up to a step ahead when the others hold: it waits for
    # their gradients before it can hear the question, so they go on step by step
    workers = [SimulatedWorker(i, 0.05, delay) for i, delay in enumerate(delays)]
    job = job_of(workers, grace=60)
    started = time.monotonic()
    job.stop_together(workers)
    assert time.monotonic() - started < 30
    assert not any(w.running() for w in workers)
    assert len({w.stopped_at for w in workers}) == 1 and workers[0].stopped_at is not None, \
        [w.stopped_at for w in workers]


def test_without_stepping_on_a_worker_that_hears_late_waits_forever(monkeypatch):
    # The scenario above is the one that needs the second question: without it the job hangs
    monkeypatch.setattr(supervise, 'STEP_ON', 1e9)
    workers = [SimulatedWorker(0, 0.05, 0.0), SimulatedWorker(1, 0.05, 0.6)]
    job = job_of(workers, grace=3)
    job.stop_together(workers)
    assert any(w.running() for w in workers)
    for w in workers:  # let them go
        w.send('stop-at 0')
        w.control.stop.signum = 15

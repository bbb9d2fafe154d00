"""A parameter-server job supervised: started in order, watched, stopped in order, restarted.

``Job`` is one attempt: it starts the roles of ``launch.plan`` under their
agents (the scheduler first, the others once its agent holds the port),
pings the agents, takes a host not heard for ``timeout`` seconds as lost and a
process stopped (SIGSTOP) that long as hung, stops the job when a process
fails, and when no worker queued a step for the stall time names the worker
behind, with every worker's Python stack, and stops it (``hung``, status 3).
A signal stops it in order: the workers after a common step (their
checkpoint written), then the servers and the scheduler; a second signal
kills every process at once. ``launch`` runs attempts until one ends, up to
``max_restarts`` restarts from the workers' checkpoint without the hosts
that were lost. Its lines go to standard error as ``launch: ...``; its stop
lines are the caller's (``words``: the command line's ``cli.messages``).
"""
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time

from . import agent, hung
from .plan import (HEARTBEAT, TERM_WAIT, LaunchError, keeps_checkpoints, plan, preflight, relay,
                   spawn, with_resume)

__all__ = ['Job', 'launch', 'say', 'STEP_ON']

#: Seconds without every worker's answer to a stop before those holding lowest go on a step.
STEP_ON = 1.0


def _reachable(roles):
    """The roles of ``roles`` whose agent runs here and is not lost."""
    return [r for r in roles if r.running() and not r.lost]


def _tell(roles, line):
    """Send ``line`` to the agent of every role of ``roles`` (``Role.send``)."""
    for r in roles:
        r.send(line)


def say(line, lock=None):
    """Write the launcher's line ``launch: LINE`` to standard error (under ``lock``, if any)."""
    with lock or contextlib.nullcontext():
        print(f'launch: {line}', file=sys.stderr, flush=True)


class Job:
    """The roles of one attempt, started, watched and stopped in order.

    ``settings``: a ``launch.Settings``; ``signals``: a list the caller's
    signal handler appends signal numbers to (each one is taken once);
    ``words``: the stop lines, an object with ``launch_heard(signum, grace)``,
    ``launch_stopped_now(signum)`` and ``launch_stopped(signum)`` (and, for
    ``launch``, ``launch_not_started()`` and ``launch_resume(command)``):
    ``cli.messages``. The processes' lines go to standard output.
    """

    def __init__(self, settings, roles, signals, words):
        self.settings, self.roles, self.signals, self.words = settings, roles, signals, words
        self.workers = [r for r in roles if r.kind == 'worker']
        self.others = [r for r in roles if r.kind != 'worker']
        self.lock, self.seen_signals, self._next_ping = threading.Lock(), 0, 0.0
        self.killed = False  # a second signal killed every process at once

    def say(self, line):
        say(line, self.lock)

    def start(self):
        """Start the scheduler, and once its agent holds the port, the other roles."""
        for role in self.roles:
            spawn(self.settings, role)
            threading.Thread(target=relay, args=(role, sys.stdout, self.lock), daemon=True).start()
            if role.kind == 'scheduler':
                self._await_port(role)

    def _await_port(self, role):
        """Wait for the scheduler's agent to start it; raise ``LaunchError`` if its port was
        taken since the check (another launch on it): nothing else of this job has started."""
        deadline = time.monotonic() + self.settings.timeout
        while not role.started and role.status is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if role.status == agent.PORT_TAKEN:
            self.kill_all()
            raise LaunchError(f'port {role.env["DMLC_PS_ROOT_PORT"]} on {role.host} was taken '
                              'after the check (another launch on it?); give another --port or '
                              'leave --port out')

    def tick(self):
        """Ping the agents when due, mark silent or stopped roles lost; return a new signal."""
        now = time.monotonic()
        if now >= self._next_ping:
            _tell(self.roles, 'ping')
            self._next_ping = now + HEARTBEAT
        timeout = self.settings.timeout
        for r in _reachable(self.roles):  # lost (not heard) or hung (stopped): the first kept
            if now - r.heard > timeout:
                r.lost = f'not heard from {r.host} for {timeout:g} s (host or link down)'
            elif not r.hung and r.stopped_since and now - r.stopped_since > timeout:
                r.hung = f'stopped (SIGSTOP) for {timeout:g} s'
        if len(self.signals) > self.seen_signals:
            self.seen_signals = len(self.signals)
            return self.signals[-1]
        return None

    def run(self):
        """Start the job and watch it; return ``(status, failed_role)``.

        ``status``: 0 when every worker ended with 0; 1 when a process failed
        or a host was lost (``failed_role`` says which); 3 when the steps
        stalled (``failed_role``: the worker behind); 128 + the signal number
        when stopped by a signal.
        """
        try:
            self.start()
        except OSError as e:
            self.say(f'could not start a process: {e.strerror or e}')
            self.kill_all()
            return 1, None
        while True:
            if (signum := self.tick()) is not None:
                return self.stop_on_signal(signum), None
            stall = hung.find(self.workers, hung.stall_seconds(self.settings, self.workers))
            if stall is not None:  # each process's Python stack, the workers behind named
                _tell(self.roles, 'dump')
                time.sleep(hung.DUMP_WAIT)  # the stacks are written from a signal handler, at once
                self.say(stall.describe())
                self.stop(coordinated=False)
                return hung.STALLED, stall.behind[0]
            if (failed := next((r for r in self.roles if r.failure()), None)) is not None:
                self.say(f'{failed.label} {failed.failure()}; stopping the job')
                self.stop(coordinated=False)
                return 1, failed
            if all(r.ended() for r in self.workers):
                return self.finish(), None
            time.sleep(0.1)

    def finish(self):
        """Every worker ended with 0: the scheduler and servers end by themselves, or never
        saw the workers join."""
        if self.wait(self.others, min(self.settings.grace, 10.0)):
            return 0
        self.stop(coordinated=False)
        self.say('every worker ended, but the scheduler and servers still waited for them: the '
                 'command never joined the parameter server (train.py joins it with --kvstore '
                 'dist_sync, dist_device_sync or dist_async)')
        return 1

    def stop_on_signal(self, signum):
        """Stop the job in order on a first signal; return its exit status, 128 + ``signum``."""
        self.say(self.words.launch_heard(signum, self.settings.grace))
        if self.stop(coordinated=True):
            self.say(self.words.launch_stopped(signum))
        return 128 + signum

    def wait(self, roles, seconds, done=None):
        """Wait until every role of ``roles`` has ended (or ``done()``), at most ``seconds``;
        True if it came.

        A further signal meanwhile kills every process at once (``killed``) and returns False.
        """
        deadline = time.monotonic() + seconds
        while not done() if done else any(r.running() for r in roles):
            if (signum := self.tick()) is not None and not self.killed:
                self.say(self.words.launch_stopped_now(signum))
                self.kill_all()
                self.killed = True
            if self.killed or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def stop(self, coordinated):
        """Stop the job in order: workers (after a common step if ``coordinated``), then servers
        and scheduler; SIGTERM, then SIGKILL, through the agents. Return False if a second
        signal made it kill everything at once."""
        if coordinated:
            self.stop_together(_reachable(self.workers))
        for group in (self.workers, self.others):
            alive = _reachable(group)
            _tell(alive, 'term')
            if not self.wait(alive, TERM_WAIT):
                _tell(alive, 'kill')
                self.wait(alive, TERM_WAIT)
            if self.killed:
                return False
        self.kill_all()
        return True

    def stop_together(self, workers):
        """Stop ``workers`` after one step, the same for all, within the grace period.

        Each is asked (``stop-ask``) and holds at its next step end, saying which
        (``held N``); once every one still running has, all are told the largest
        (``stop-at S``): none is past it, those behind go on to it. One behind a
        worker that holds may wait for that worker's gradients before it can hear
        the question: while an answer is missing, every ``STEP_ON`` seconds those
        holding at the lowest step are asked again (they go on one step and say).
        """
        deadline, asked = time.monotonic() + self.settings.grace, workers
        for r in workers:
            r.held = None
        while not self.killed and (left := deadline - time.monotonic()) > 0:
            _tell(asked, 'stop-ask')
            if self.wait(workers, min(STEP_ON, left),
                         lambda: all(r.held is not None for r in workers if r.running())):
                running = [r for r in workers if r.running()]
                _tell(running, f'stop-at {max((r.held for r in running), default=0)}')
                self.wait(workers, deadline - time.monotonic())
                return
            held = [r for r in workers if r.running() and r.held is not None]
            asked = [r for r in held if r.held == min(h.held for h in held)]
            for r in asked:
                r.held = None

    def kill_all(self):
        """Kill every agent (and ssh client) still running here; the agents end their processes
        (on a lost host, the agent does so itself after the timeout)."""
        _tell(_reachable(self.roles), 'kill')
        deadline, started = time.monotonic() + 1.0, [r for r in self.roles if r.proc is not None]
        for r in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if r.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
        for r in started:  # their output read to the end (``relay``)
            r.relayed.wait(timeout=1)


def launch(settings, hosts, command, signals, resume=None, *, words):
    """Run the job, restarting it up to ``settings.max_restarts`` times; return the exit status.

    0 when every worker ended with 0; 1 if a process failed or a host was lost
    (restarts spent), or a restart cannot start; 2 when a worker stopped on bad
    input (status 2); 3 when the steps stalled (restarts spent); 128 + the
    signal number when stopped by one of ``signals`` (see ``Job``). ``resume``:
    the command line that continues the job, said after a stop by a signal
    when the workers keep checkpoints; ``words``: the stop lines (see ``Job``).
    Raises ``LaunchError`` when the first attempt's checks fail or the
    scheduler's port was taken: nothing of the job is left running.
    """
    for restarts in itertools.count():  # each attempt; the restarts before it
        roles = plan(settings, hosts, command)
        try:
            port = preflight(settings, roles, settings.port)
        except LaunchError as e:
            if restarts == 0:
                raise
            say(f'cannot restart: {e}')
            return 1
        if signals:
            say(words.launch_not_started())
            return 128 + signals[0]
        for role in roles:
            role.env['DMLC_PS_ROOT_PORT'] = str(port)
        job = Job(settings, roles, signals, words)
        status, failed = job.run()
        if status > 128 and resume and keeps_checkpoints(command):
            job.say(words.launch_resume(resume))
        if (done := _ended(job, settings, status, failed, restarts)) is not None:
            return done
        # without the hosts lost in this attempt (all of them if all were)
        lost = {r.host for r in roles if r.lost or (r.failure() or '').startswith('its connection')}
        hosts = [h for h in hosts if h not in lost] if lost and len(lost) < len(hosts) else hosts
        command = with_resume(command)
        job.say(f'restart {restarts + 1} of {settings.max_restarts}: starting the job again from '
                f'its checkpoint on {len(hosts)} host(s) ({", ".join(hosts)})')


def _ended(job, settings, status, failed, restarts):
    """The launch's exit status once an attempt that ended with ``status`` is the last; None
    when the job is to be restarted."""
    # a worker's bad input, or a role's MXNet that cannot load here (plan.run_role): status 2
    if failed is not None and failed.status == 2:
        if settings.max_restarts:
            job.say(f'{failed.label} stopped on bad input (status 2), which a restart would '
                    'meet again: not restarting')
        return 2  # the command's input is bad: its status
    if status not in (1, hung.STALLED) or restarts >= settings.max_restarts or job.signals:
        if status in (1, hung.STALLED) and settings.max_restarts:
            job.say(f'gave up after {restarts} restart(s) (--max-restarts {settings.max_restarts})')
        return status
    return None

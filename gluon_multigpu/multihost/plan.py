"""A parameter-server job's plan and its processes: the roles, each started under its agent.

What the launcher (``scripts/launch.py``) does before and around supervision
(``supervise``): ``plan`` places the scheduler, the servers and the workers on
the hosts, each a ``Role`` with its DMLC_* variables; ``preflight`` checks
every host before anything starts (the worker's program, the scheduler's
port; over ssh or as Slurm job steps, that each host answers with this folder and
this Python); ``spawn`` starts a role under its agent (``agent``), here, over ssh or
as a job step of the Slurm allocation the launcher runs in (``srun``), and
``relay`` copies its lines behind its label and takes in its agent's
control lines (steps, rank, heartbeats, exit status). The launch is told
what to do by a ``Settings`` of plain values.
"""
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import agent
from ..base import compat, engine, signals
from ..errors import GluonMultiGPUError, MXNetLoadError

__all__ = ['GRACE', 'TERM_WAIT', 'HEARTBEAT', 'TIMEOUT', 'LaunchError', 'Settings', 'Role', 'plan',
           'preflight', 'spawn', 'relay', 'transport_argv', 'remote_command',
           'last_line', 'keeps_checkpoints', 'with_resume', 'ROLE', 'run_role']

#: Seconds the workers get to finish their step and checkpoint when the job is stopped.
GRACE = 60.0
#: Seconds a process gets after SIGTERM before SIGKILL (workers, once past the grace; servers).
TERM_WAIT = 3.0
#: Seconds between heartbeats, and seconds of silence after which a host is taken as lost.
HEARTBEAT, TIMEOUT = 2.0, 15.0


class LaunchError(GluonMultiGPUError):
    """A bad command line, or a host that cannot run the job: one line, exit status 2."""


@dataclass(frozen=True)
class Settings:
    """What a launch is told (the launcher's flags, as plain values).

    ``launcher``: ``'local'`` (every process here, on loopback), ``'ssh'``
    (on the hosts, with ``ssh_port``, ``ssh_identity`` and ``ssh_config``
    added to ssh's own configuration) or ``'slurm'`` (job steps on the nodes
    of the allocation it runs in: ``nodes``, the ``(address, node)`` of each
    host); ``port``: the scheduler's (None: a
    free one); ``grace``, ``timeout`` and ``step_timeout`` in seconds (0: no
    step watched); ``train_program``: how messages name the training program
    in an example command.
    """
    num_workers: int
    num_servers: int = 1
    launcher: str = 'local'
    port: Optional[int] = None
    max_restarts: int = 0
    grace: float = GRACE
    timeout: float = TIMEOUT
    step_timeout: float = 0.0
    ssh_port: Optional[int] = None
    ssh_identity: Optional[str] = None
    ssh_config: Optional[str] = None
    train_program: str = 'gluon-multigpu-train'
    nodes: tuple = ()


def keeps_checkpoints(command):
    """Whether a worker command writes checkpoints (gives ``--checkpoint-dir``)."""
    return any(a == '--checkpoint-dir' or a.startswith('--checkpoint-dir=') for a in command)


def with_resume(command):
    """``command`` continuing from its checkpoint."""
    return command if '--resume' in command else [*command, '--resume']


# -- the roles ----------------------------------------------------------------------------------

class Role:
    """One process of the job: its place, its command, and what its agent has said.

    Attributes
    ----------
    proc, rank, steps, held, heard, stopped_since
        Its agent's process, its rank, its steps, the step it holds at when asked to stop,
        when it was last heard, stopped since when.
    stepped, resting, stall
        When its step count last changed (None: no step yet); whether its epoch's steps are
        done (evaluation: not watched); the stall time its command asked for (seconds), if any.
    status, started, relayed, exited
        The exit status its agent reported; whether its agent has started its command; an
        event set once its output is read to the end; when its agent was first seen ended.
    lost, hung
        Why the launcher gave up reaching it (silent); why it is taken as hung (stopped, no
        step), though reachable.
    """

    def __init__(self, kind, index, host, env, argv):
        self.kind, self.index, self.host, self.env, self.argv = kind, index, host, env, argv
        self.proc = self.rank = self.stepped = self.stall = self.status = self.held = None
        self.stopped_since = self.exited = self.lost = self.hung = None
        self.steps, self.resting, self.started = 0, False, False
        self.heard, self.relayed = time.monotonic(), threading.Event()

    @property
    def label(self):
        name = self.kind if self.kind == 'scheduler' else f'{self.kind} {self.index}'
        return f'{name}@{self.host}' + (f' as rank {self.rank}' if self.rank is not None else '')

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def ended(self):
        """Whether its agent (or ssh) has ended and its last lines are read (its exit line
        among them; at most 2 s after it ended, should something else hold its output open)."""
        if self.proc is None or self.proc.poll() is None:
            return False
        self.exited = self.exited or time.monotonic()
        return self.relayed.is_set() or time.monotonic() - self.exited > 2.0

    def failure(self):
        """What went wrong with this process, as words, or None."""
        if self.lost or self.hung or not self.ended():
            return self.lost or self.hung or None
        if self.status is None:  # no exit line: the agent or its connection died
            code = self.proc.returncode
            return (f'its connection to {self.host} ended (ssh status {code})'
                    if code == 255 else f'its agent ended ({_status_words(code)})')
        return None if self.status == 0 else f'failed ({_status_words(self.status)})'

    def send(self, line):
        """Send one line to its agent (quietly nothing if it cannot be)."""
        if self.running():
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.write((line + '\n').encode())
                self.proc.stdin.flush()


def _status_words(code):
    code = 128 - code if code < 0 else code
    with contextlib.suppress(ValueError):  # a status over 128 that is no signal's
        return f'signal {signal.Signals(code - 128).name}' if code > 128 else f'status {code}'
    return f'status {code}'


#: What a scheduler or server runs (``run_role``): MXNet runs the role as it loads (the DMLC_*
#: variables say which), after the package has prepared NumPy for it (base.compat), then exits.
ROLE = 'from gluon_multigpu.multihost import plan; plan.run_role()'


def run_role():
    """A scheduler's or server's process (``ROLE``): load MXNet, which runs the role; an MXNet
    that cannot load here is one line saying what to do, and exit status 2."""
    try:
        import mxnet  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except (MXNetLoadError, ImportError) as e:  # base.compat's finder said what to do, or
        # not installed, or a module of it missing
        why = str(e) if isinstance(e, MXNetLoadError) else compat.load_advice(e)
        print(f'error: {why}', file=sys.stderr, flush=True)
        sys.exit(2)


def plan(settings, hosts, command):
    """Return the roles: scheduler, servers, workers, in start order.

    Their variables lack the scheduler's port (``DMLC_PS_ROOT_PORT``): the launch sets it
    once ``preflight`` has found it on the first host."""
    shared = {'DMLC_PS_ROOT_URI': _address(hosts[0]), 'DMLC_NUM_SERVER': str(settings.num_servers),
              'DMLC_NUM_WORKER': str(settings.num_workers)}
    server = [sys.executable, '-c', ROLE]  # MXNet runs the role, then exits

    def role(kind, index, host, extra, argv):
        return Role(kind, index, host, dict(shared, DMLC_ROLE=kind, DMLC_NODE_HOST=_address(host),
                                            **extra), argv)
    placed = [hosts[(i + settings.num_servers + 1) % len(hosts)]
              for i in range(settings.num_workers)]
    # a worker's host's cores are divided among the workers it runs (base.engine)
    return [role('scheduler', 0, hosts[0], {}, server),
            *(role('server', i, hosts[(i + 1) % len(hosts)], {}, server)
              for i in range(settings.num_servers)),
            *(role('worker', i, host, {'GLUON_MULTIGPU_WORKER': str(i),
                                       engine.HOST_WORKERS: str(placed.count(host))}, command)
              for i, host in enumerate(placed))]


def _address(host):
    """The host part of ``[user@]host``."""
    return host.rsplit('@', 1)[-1]


# -- starting processes, here or over ssh -------------------------------------------------------

def _die_with_parent():
    """A ``preexec_fn``: the child in its own process group, and SIGTERM when the launcher dies
    (Linux): the agent then ends its command's whole tree (SIGKILL would end the agent before it
    could)."""
    return signals.dying_with_parent(signal.SIGTERM, first=os.setpgrp)


def transport_argv(settings, host, remote):
    """How the shell command ``remote`` runs on ``host``: as a job step of the allocation on its
    node (slurm: one task, sharing the node with the job's other steps, ``--overlap``, its lines
    as they come), or over ``ssh``, the host after ``--``."""
    if settings.launcher == 'slurm':
        return ['srun', '--nodes=1', '--ntasks=1', f'--nodelist={dict(settings.nodes)[host]}',
                '--overlap', '--quiet', '--unbuffered', '--', '/bin/sh', '-c', remote]
    given = {'-p': settings.ssh_port, '-i': settings.ssh_identity, '-F': settings.ssh_config}
    options = [w for flag, value in given.items() if value is not None for w in (flag, str(value))]
    return ['ssh', '-T', '-o', 'BatchMode=yes', *options, '--', host, remote]


def remote_command(env, argv):
    """The shell command that runs ``argv`` with the variables ``env`` in this folder."""
    exports = ' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())
    return f'cd {shlex.quote(os.getcwd())} && exec env {exports} {shlex.join(argv)}'


def spawn(settings, role):
    """Start ``role`` under its agent; set ``role.proc``."""
    hold = ['--hold-port', role.env['DMLC_PS_ROOT_PORT']] if role.kind == 'scheduler' else []
    under_agent = agent.agent_argv(['--heartbeat', str(HEARTBEAT), '--grace', str(TERM_WAIT),
                                    '--timeout', str(settings.timeout), *hold], role.argv)
    argv, env = (under_agent, role.env) if settings.launcher == 'local' else (
        transport_argv(settings, role.host, remote_command(role.env, under_agent)), {})
    role.proc = subprocess.Popen(argv, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                 preexec_fn=_die_with_parent())
    role.heard = time.monotonic()


def relay(role, out, lock):
    """Copy ``role``'s output to ``out`` behind its label; take in its agent's control lines."""
    try:
        while (read := agent.read_line(role.proc.stdout, agent.LINE_LIMIT + 64)) is not None:
            role.heard = time.monotonic()
            if (line := read[0].decode(errors='replace')).startswith(agent.CONTROL):
                _take_control(role, line[len(agent.CONTROL):].split())
                continue
            with lock, contextlib.suppress(OSError, ValueError):
                out.write(f'[{role.label}] {agent.shown(read)}\n')
                out.flush()
    finally:
        role.relayed.set()


#: The control lines that give a count (``step N``, ...): the ``Role`` attribute each sets.
_COUNTS = {'step': 'steps', 'held': 'held', 'rank': 'rank', 'exit': 'status'}


def _take_control(role, words):
    """What an agent's control line (its ``words``) says of ``role``."""
    what, value = (*words, '', '')[:2]
    if what in _COUNTS and value.isdigit():  # ``held``: the step it holds at, asked to stop
        setattr(role, _COUNTS[what], int(value))
        if what == 'step':
            role.stepped, role.resting = time.monotonic(), False
    elif what == 'beat':
        stopped = words[1:] == ['stopped']
        role.stopped_since = (role.stopped_since or time.monotonic()) if stopped else None
    elif what in ('rest', 'watch'):  # an epoch's steps done; the next epoch's ahead
        role.resting = what == 'rest'
        role.stepped = role.stepped and time.monotonic()
    elif what == 'stall' and value:  # a positive finite number of seconds, else none
        role.stall = None
        with contextlib.suppress(ValueError):
            role.stall = float(value) if 0 < float(value) < float('inf') else None
    elif what == 'started':
        role.started = True


# -- the checks before anything starts ----------------------------------------------------------

def preflight(settings, roles, port):
    """Check every host before anything starts; return the scheduler's port.

    Here: the worker's program exists, and the port is free (or a free one).
    With ssh (or as Slurm job steps), on every host in parallel: ssh (srun)
    reaches it, this folder and this Python are there with the package, the
    worker's program is there (hosts of workers), and the port is free on the
    first host. Raises ``LaunchError``.
    """
    command = next(r.argv for r in roles if r.kind == 'worker')
    if settings.launcher == 'local':  # on this machine alone
        if agent.find_program(command[0]) is None:
            raise LaunchError(f'the command {command[0]} is not a program that can be run here; '
                              'give an executable or one on the PATH, e.g. -- '
                              f'{settings.train_program} ...')
        if 'error' in (answer := agent.check([], port or 0)):
            raise LaunchError(f'--{answer["error"]}; give another port or leave --port out')
        return answer['port']
    first = next(r.host for r in roles if r.kind == 'scheduler')
    workers = {r.host for r in roles if r.kind == 'worker'}
    procs = {}
    for host in dict.fromkeys(r.host for r in roles):  # each host once, in the roles' order
        flags = ['--check', '--port', str(port or 0)] if host == first else ['--check']
        remote = remote_command({}, agent.agent_argv(flags, command[:1] if host in workers else []))
        procs[host] = subprocess.Popen(transport_argv(settings, host, remote),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent())
    try:  # the answers, host by host; the port the scheduler's host found
        found, via = None, 'srun' if settings.launcher == 'slurm' else 'ssh'
        for host, proc in procs.items():
            found = _answer(host, proc, via).get('port', found)
        return found
    except LaunchError:
        for p in procs.values():
            p.kill()
        raise


def _answer(host, proc, via):
    """The check's answer of ``host`` (its ``via`` ssh or srun process). Raises ``LaunchError``
    if it does not answer well."""
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        check = (f'`ssh {host}` works without a prompt' if via == 'ssh' else
                 'a job step starts on each node (`srun hostname`)')
        raise LaunchError(f'host {host}: no answer over {via} in 30 s; check that {check}') \
            from None
    answer = _last_json(out)
    if answer is None or 'error' in answer:
        how = 'a job step of the allocation' if via == 'srun' else 'ssh without a prompt'
        why = ((answer or {}).get('error') or last_line(err.decode(errors='replace'))
               or f'{via} status {proc.returncode}')
        raise LaunchError(f'host {host}: {why}; each host needs {how}, this '
                          f'folder ({os.getcwd()}) and this Python ({sys.executable}) with '
                          'the package, and the worker\'s program')
    return answer


def _last_json(out):
    for line in reversed(out.decode(errors='replace').splitlines()):
        with contextlib.suppress(ValueError):
            if isinstance(value := json.loads(line), dict):
                return value
    return None


def last_line(text):
    """The last line of ``text`` that is not blank, stripped ('' when there is none)."""
    return next((l.strip() for l in reversed(text.splitlines()) if l.strip()), '')

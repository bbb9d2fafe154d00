"""Start a training on MXNet's parameter server: scheduler, servers and workers, supervised.

The roles take their part and addresses from the documented DMLC_* variables
(DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER,
DMLC_NUM_WORKER). The scheduler and the servers are MXNet itself (importing
mxnet with DMLC_ROLE=server runs a server until the workers are done); every
worker runs the command given after ``--``. Each process runs under an agent
on its host (``gluon_multigpu.multihost.agent``, over ssh with ``--launcher ssh``)
that relays its lines, reports it, and ends it when the launcher says so or
is gone: no process of the job outlives the launcher on any host, however the
launcher ends. Every line comes out behind its role, host and, once the
worker has joined, its rank: ``[worker 1@198.18.0.3 rank 0]``.

A process that fails, a host that is not heard for --timeout seconds (its
link down, the host gone) or a process stopped (SIGSTOP) that long stops the
job: exit status 1 naming it, or, with --max-restarts, a restart from the
workers' checkpoint. Ctrl-C, SIGTERM or SIGHUP stop the job in order: the
workers stop after one step, the same for all, and the first worker writes
its checkpoint; then the servers and the scheduler. A second Ctrl-C stops
every process at once. Bad input (a command that is not there, a host that
cannot be reached, a port in use) stops before any process starts, with one
line and status 2.
"""
import argparse
import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

from . import common
from ..errors import GluonMultiGPUError
from ..base import reading
from ..multihost import agent

EPILOG = """\
examples:
  %(prog)s -n 2 -s 1 -- python scripts/train.py --kvstore dist_sync --cpu-devices 1 \\
      --model simple-cnn --num-epochs 1 --data-dir ../shared/data/fashion-mnist
  %(prog)s -n 4 -s 2 --launcher ssh -H hosts.txt --max-restarts 3 -- \\
      python scripts/train.py --kvstore dist_sync --checkpoint-dir /nfs/run1 ...

The host file lists one host name or address per line, optionally user@host
(# starts a comment; each host once; at most 1 MiB); with ssh the scheduler
runs on the first host, and
servers and workers on the hosts in turn. Each host must reach the others and
have the same checkout at the same path (the current directory) with the same
Python (this one's path), and be reachable with ssh without a prompt (ssh's
own configuration applies; --ssh-port, --ssh-identity and --ssh-config add
to it). With --max-restarts the checkpoint folder must be storage that every
host reads (the first worker writes it, and after a restart the first worker
may be on another host).

Output lines over 64 KiB are cut, with "... [line cut: N bytes more]";
control characters from the processes are shown as ^X (ESC as ^[).
"""
#: Seconds the workers get to finish their step and checkpoint when the job is stopped.
GRACE = 60.0
#: Seconds a process gets after SIGTERM before SIGKILL (workers, once past the grace; servers).
TERM_WAIT = 3.0
#: Seconds between heartbeats, and seconds of silence after which a host is taken as lost.
HEARTBEAT, TIMEOUT = 2.0, 15.0
#: A host as a host file may give it: [user@]name-or-address, never beginning with '-'.
#: The largest host file read (a host per line: far more hosts than any cluster has).
HOSTFILE_LIMIT = 1 << 20
HOST = re.compile(r'^(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9.:_-]*$')


class LaunchError(Exception):
    """A bad command line, or a host that cannot run the job: one line, exit status 2."""


def build_parser():
    """Return the argument parser of this script."""
    p = common.OneLineParser(description=__doc__.splitlines()[0], epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('-n', '--num-workers', type=common.int_in(1, 256), required=True, metavar='N',
                   help='worker processes, each running the command')
    p.add_argument('-s', '--num-servers', type=common.int_in(1, 256), default=1, metavar='N',
                   help='parameter-server processes (default: 1)')
    p.add_argument('--launcher', choices=['local', 'ssh'], default='local',
                   help='local: every process on this machine, on loopback; ssh: on the hosts '
                   'of --hostfile (default: local)')
    p.add_argument('-H', '--hostfile', metavar='FILE', help='hosts for --launcher ssh')
    p.add_argument('--port', type=common.int_in(1024, 65535), metavar='PORT',
                   help="the scheduler's port, checked free on its host (default: a free one)")
    p.add_argument('--max-restarts', type=common.int_in(0, 1000), default=0, metavar='N',
                   help='when a process fails or a host is lost, stop the job and start it again '
                   'with --resume, up to N times, without the hosts that were lost; the command '
                   'must give --checkpoint-dir (default: 0)')
    p.add_argument('--grace', type=common.positive_float, default=GRACE, metavar='SECONDS',
                   help='when the job is stopped, seconds the workers get to finish their step '
                   f'and write their checkpoint before SIGTERM and SIGKILL (default: {GRACE:g})')
    p.add_argument('--timeout', type=common.positive_float, default=TIMEOUT, metavar='SECONDS',
                   help='a host not heard from (heartbeats every 2 s), or a process stopped, for '
                   'this long is lost, and stops the job; an agent that does not hear the '
                   f'launcher for this long ends its process (default: {TIMEOUT:g})')
    p.add_argument('--step-timeout', type=common.non_negative_float, default=0.0,
                   metavar='SECONDS',
                   help='a worker that has trained but queued no step for this long is hung '
                   '(deadlocked, or waiting for a process that cannot answer), and stops the '
                   'job; leave room for the first worker\'s evaluation at each epoch\'s end, '
                   'during which the others wait (default: 0, not watched)')
    p.add_argument('--ssh-port', type=common.int_in(1, 65535), metavar='PORT',
                   help="the hosts' ssh port (default: ssh's configuration, else 22)")
    p.add_argument('--ssh-identity', metavar='FILE', help='the private key ssh logs in with')
    p.add_argument('--ssh-config', metavar='FILE',
                   help="an ssh configuration file instead of the user's")
    p.add_argument('command', nargs=argparse.REMAINDER,
                   help='after --: the command every worker runs')
    return p


# -- the plan: hosts, roles, commands -----------------------------------------------------------

def read_hosts(path):
    """The hosts of a host file (at most ``HOSTFILE_LIMIT`` bytes), one per line; raise
    ``LaunchError`` if there are none, one is not a host name (nothing that ssh could take for
    an option; a name at most 253 bytes, a user at most 32) or a host comes twice."""
    try:
        lines = reading.read_text(path, HOSTFILE_LIMIT, '--hostfile').splitlines()
    except FileNotFoundError:
        raise LaunchError(f'--hostfile {path}: No such file or directory; give a file with '
                          'one host per line') from None
    except GluonMultiGPUError as e:
        raise LaunchError(str(e)) from None
    hosts, seen = [], {}
    for number, line in enumerate(lines, 1):
        host = line.split('#')[0].strip()
        if not host:
            continue
        user, _, name = host.rpartition('@')
        if len(name) > 253 or len(user) > 32 or not HOST.match(host):
            raise LaunchError(f'--hostfile {path} line {number}: {host[:80]!r} is not a host name '
                              "or address (letters, digits, '.', '-', ':', '_', at most 253 of "
                              "them, an optional user@, not beginning with '-'); fix the line")
        if name in seen:
            raise LaunchError(f'--hostfile {path} line {number}: host {name} is already on line '
                              f'{seen[name]}; list each host once')
        seen[name] = number
        hosts.append(host)
    if not hosts:
        raise LaunchError(f'--hostfile {path} lists no host; give one host per line')
    return hosts


def worker_command(args):
    """The command every worker runs (after ``--``); raise ``LaunchError`` if there is none."""
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not command:
        raise LaunchError('no command to run: give it after --, e.g. -- '
                          f'{common.program("train")} --kvstore dist_sync ...')
    if args.max_restarts and not keeps_checkpoints(command):
        raise LaunchError('--max-restarts resumes the workers from their checkpoint: give the '
                          'command --checkpoint-dir DIR (on storage every host reads)')
    return command


def keeps_checkpoints(command):
    """Whether a worker command writes checkpoints (gives ``--checkpoint-dir``)."""
    return any(a == '--checkpoint-dir' or a.startswith('--checkpoint-dir=') for a in command)


def check_args(args):
    """Check the command line; return ``(hosts, command)``."""
    command = worker_command(args)
    if args.launcher == 'ssh':
        if not args.hostfile:
            raise LaunchError('--launcher ssh needs --hostfile FILE with the hosts')
        for flag, path in (('--ssh-identity', args.ssh_identity),
                           ('--ssh-config', args.ssh_config)):
            if path is not None and not os.path.isfile(path):
                raise LaunchError(f'{flag} {path}: no such file; give an existing file')
        return read_hosts(args.hostfile), command
    for flag in ('hostfile', 'ssh_port', 'ssh_identity', 'ssh_config'):
        if getattr(args, flag) is not None:
            raise LaunchError(f'--{flag.replace("_", "-")} goes with --launcher ssh')
    return ['127.0.0.1'], command


class Role:
    """One process of the job: its place, its command, and what its agent has said."""

    def __init__(self, kind, index, host, env, argv):
        self.kind, self.index, self.host, self.env, self.argv = kind, index, host, env, argv
        self.proc = None
        self.rank = None
        self.steps = 0
        self.stepped = None     # when its step count last changed (None: no step yet)
        self.status = None      # the exit status its agent reported
        self.started = False    # its agent has started its command
        self.heard = time.monotonic()
        self.stopped_since = None
        self.relayed = threading.Event()  # its output is read to the end
        self.exited = None      # when its agent was first seen ended
        self.lost = None        # why the launcher gave up reaching it (silent)
        self.hung = None        # why it is taken as hung (stopped, no step), though reachable

    @property
    def label(self):
        name = self.kind if self.kind == 'scheduler' else f'{self.kind} {self.index}'
        rank = f' rank {self.rank}' if self.rank is not None else ''
        return f'{name}@{self.host}{rank}'

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def ended(self):
        """Whether its agent (or ssh) has ended and its last lines are read (its exit line
        among them; at most 2 s after it ended, should something else hold its output open)."""
        if self.proc is None or self.proc.poll() is None:
            return False
        if self.exited is None:
            self.exited = time.monotonic()
        return self.relayed.is_set() or time.monotonic() - self.exited > 2.0

    def failure(self):
        """What went wrong with this process, as words, or None."""
        if self.lost or self.hung:
            return self.lost or self.hung
        if not self.ended():
            return None
        if self.status is None:  # no exit line: the agent or its connection died
            code = self.proc.returncode
            return (f'its connection to {self.host} ended (ssh status {code})'
                    if code == 255 else f'its agent ended ({_status_words(code)})')
        return None if self.status == 0 else f'failed ({_status_words(self.status)})'

    def send(self, line):
        """Send one line to its agent (quietly nothing if it cannot be)."""
        if self.running():
            try:
                self.proc.stdin.write((line + '\n').encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass


def _status_words(code):
    if code < 0:
        code = 128 - code
    try:
        return f'signal {signal.Signals(code - 128).name}' if code > 128 else f'status {code}'
    except ValueError:
        return f'status {code}'


def plan(args, hosts, command):
    """Return the roles: scheduler, servers, workers, in start order.

    Their variables lack the scheduler's port (``DMLC_PS_ROOT_PORT``): ``launch`` sets it
    once ``preflight`` has found it on the first host."""
    shared = {'DMLC_PS_ROOT_URI': _address(hosts[0]),
              'DMLC_NUM_SERVER': str(args.num_servers), 'DMLC_NUM_WORKER': str(args.num_workers)}
    server = [sys.executable, '-c', 'import mxnet']  # MXNet runs the role, then exits

    def role(kind, index, host, extra, argv):
        env = dict(shared, DMLC_ROLE=kind, DMLC_NODE_HOST=_address(host), **extra)
        return Role(kind, index, host, env, argv)
    roles = [role('scheduler', 0, hosts[0], {}, server)]
    for i in range(args.num_servers):
        roles.append(role('server', i, hosts[(i + 1) % len(hosts)], {}, server))
    for i in range(args.num_workers):
        roles.append(role('worker', i, hosts[(i + args.num_servers + 1) % len(hosts)],
                          {'GLUON_MULTIGPU_WORKER': str(i)}, command))
    return roles


def _address(host):
    """The host part of ``[user@]host``."""
    return host.rsplit('@', 1)[-1]


# -- starting processes, here or over ssh -------------------------------------------------------

def _die_with_parent():
    """In the child: its own process group, and SIGTERM when the launcher dies (Linux): the agent
    then ends its command's whole tree (SIGKILL would end the agent before it could)."""
    os.setpgrp()
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def agent_argv(extra, command):
    """The command that runs ``command`` under an agent on a host."""
    return [sys.executable, '-m', 'gluon_multigpu.multihost.agent', *extra, '--', *command]


def ssh_argv(args, host, remote):
    """``ssh`` to ``host`` running the shell command ``remote``; the host comes after ``--``."""
    argv = ['ssh', '-T', '-o', 'BatchMode=yes']
    if args.ssh_port is not None:
        argv += ['-p', str(args.ssh_port)]
    if args.ssh_identity is not None:
        argv += ['-i', args.ssh_identity]
    if args.ssh_config is not None:
        argv += ['-F', args.ssh_config]
    return argv + ['--', host, remote]


def remote_command(env, argv):
    """The shell command that runs ``argv`` with the variables ``env`` in this folder."""
    exports = ' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())
    return f'cd {shlex.quote(os.getcwd())} && exec env {exports} {shlex.join(argv)}'


def spawn(args, role):
    """Start ``role`` under its agent; set ``role.proc``."""
    hold = ['--hold-port', role.env['DMLC_PS_ROOT_PORT']] if role.kind == 'scheduler' else []
    agent = agent_argv(['--heartbeat', str(HEARTBEAT), '--timeout', str(args.timeout),
                              '--grace', str(TERM_WAIT), *hold], role.argv)
    if args.launcher == 'ssh':
        argv, env = ssh_argv(args, role.host, remote_command(role.env, agent)), {}
    else:
        argv, env = agent, role.env
    role.proc = subprocess.Popen(argv, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                 preexec_fn=_die_with_parent)
    role.heard = time.monotonic()


def relay(role, out, lock):
    """Copy ``role``'s output to ``out`` behind its label; take in its agent's control lines."""
    try:
        _relay(role, out, lock)
    finally:
        role.relayed.set()


def _relay(role, out, lock):
    while (read := agent.read_line(role.proc.stdout, agent.LINE_LIMIT + 64)) is not None:
        line = agent.visible(read[0].decode(errors='replace')) if not read[0].startswith(
            agent.CONTROL.encode()) else read[0].decode(errors='replace')
        line += f' ... [line cut: {read[1]} bytes more]\n' if read[1] else '\n'
        role.heard = time.monotonic()
        if line.startswith(agent.CONTROL):
            words = line[len(agent.CONTROL):].split()
            if words[:1] == ['beat']:
                if words[1:] == ['stopped']:
                    role.stopped_since = role.stopped_since or time.monotonic()
                else:
                    role.stopped_since = None
            elif words[:1] == ['step'] and words[1:2] and words[1].isdigit():
                role.steps, role.stepped = int(words[1]), time.monotonic()
            elif words[:1] == ['rank'] and words[1:2] and words[1].isdigit():
                role.rank = int(words[1])
            elif words[:1] == ['started']:
                role.started = True
            elif words[:1] == ['exit'] and words[1:2] and words[1].isdigit():
                role.status = int(words[1])
            continue
        with lock:
            try:
                out.write(f'[{role.label}] {line if line.endswith(chr(10)) else line + chr(10)}')
                out.flush()
            except (OSError, ValueError):
                pass


def preflight(args, roles, port):
    """Check every host before anything starts; return the scheduler's port.

    Here: the worker's program exists, and the port is free (or a free one).
    With ssh, on every host in parallel: ssh reaches it, this folder and this
    Python are there with the package, the worker's program is there (hosts of
    workers), and the port is free on the first host. Raises ``LaunchError``.
    """
    command = next(r.argv for r in roles if r.kind == 'worker')
    if args.launcher == 'local':
        if agent.find_program(command[0]) is None:
            raise LaunchError(f'the command {command[0]} is not a program that can be run here; '
                              'give an executable or one on the PATH, e.g. -- '
                              f'{common.program("train")} ...')
        answer = agent.check([], port or 0)
        if 'error' in answer:
            raise LaunchError(f'--{answer["error"]}; give another port or leave --port out')
        return answer['port']
    checks = {}
    for r in roles:
        extra = checks.setdefault(r.host, {'command': [], 'port': None})
        if r.kind == 'worker':
            extra['command'] = command[:1]
        if r.kind == 'scheduler':
            extra['port'] = port or 0
    procs = {}
    for host, c in checks.items():
        flags = ['--check'] + (['--port', str(c['port'])] if c['port'] is not None else [])
        remote = remote_command({}, agent_argv(flags, c['command']))
        procs[host] = subprocess.Popen(ssh_argv(args, host, remote), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                       preexec_fn=_die_with_parent)
    found = None
    for host, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            raise LaunchError(f'host {host}: no answer over ssh in 30 s; check that `ssh {host}` '
                              'works without a prompt') from None
        answer = _last_json(out)
        if answer is None or 'error' in answer:
            why = (answer or {}).get('error') or _last_line(err) or f'ssh status {proc.returncode}'
            for p in procs.values():
                p.kill()
            raise LaunchError(f'host {host}: {why}; each host needs ssh without a prompt, this '
                              f'folder ({os.getcwd()}) and this Python ({sys.executable}) with '
                              'the package, and the worker\'s program')
        if 'port' in answer:
            found = answer['port']
    return found


def _last_json(out):
    for line in reversed(out.decode(errors='replace').splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _last_line(err):
    lines = [l.strip() for l in err.decode(errors='replace').splitlines() if l.strip()]
    return lines[-1] if lines else ''


# -- a job: start, watch, stop ------------------------------------------------------------------

class Job:
    """The roles of one attempt, started, watched and stopped in order."""

    def __init__(self, args, roles, signals, out=None):
        self.args, self.roles, self.signals = args, roles, signals
        self.out = out or sys.stdout
        self.lock = threading.Lock()
        self.threads = []
        self.seen_signals = 0
        self.killed = False  # a second signal killed every process at once
        self._next_ping = 0.0

    @property
    def workers(self):
        return [r for r in self.roles if r.kind == 'worker']

    @property
    def others(self):
        return [r for r in self.roles if r.kind != 'worker']

    def say(self, line):
        with self.lock:
            print(f'launch: {line}', file=sys.stderr, flush=True)

    def start(self):
        """Start the scheduler, and once its agent holds the port, the other roles."""
        for role in self.roles:
            spawn(self.args, role)
            t = threading.Thread(target=relay, args=(role, self.out, self.lock), daemon=True)
            t.start()
            self.threads.append(t)
            if role.kind == 'scheduler':
                self._await_port(role)

    def _await_port(self, role):
        """Wait for the scheduler's agent to start it; raise ``LaunchError`` if its port was
        taken since the check (another launch on it): nothing else of this job has started."""
        deadline = time.monotonic() + self.args.timeout
        while not role.started and role.status is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if role.status == agent.PORT_TAKEN:
            self.kill_all()
            port = role.env['DMLC_PS_ROOT_PORT']
            raise LaunchError(f'port {port} on {role.host} was taken after the check (another '
                              'launch on it?); give another --port or leave --port out')

    def tick(self):
        """Ping the agents when due, mark silent or stopped roles lost; return a new signal."""
        now = time.monotonic()
        if now >= self._next_ping:
            for r in self.roles:
                r.send('ping')
            self._next_ping = now + HEARTBEAT
        for r in self.roles:
            if r.running() and not r.lost:
                if now - r.heard > self.args.timeout:
                    r.lost = f'not heard from {r.host} for {self.args.timeout:g} s (host or link down)'
                elif r.hung:  # already taken as hung: keep the first reason
                    continue
                elif r.stopped_since and now - r.stopped_since > self.args.timeout:
                    r.hung = f'stopped (SIGSTOP) for {self.args.timeout:g} s'
                elif self.args.step_timeout and r.stepped and \
                        now - r.stepped > self.args.step_timeout:
                    r.hung = (f'queued no step for {self.args.step_timeout:g} s after step '
                              f'{r.steps} (hung)')
        if len(self.signals) > self.seen_signals:
            self.seen_signals = len(self.signals)
            return self.signals[-1]
        return None

    def run(self):
        """Start the job and watch it; return ``(status, failed_role)``.

        ``status``: 0 when every worker ended with 0; 1 when a process failed
        or a host was lost (``failed_role`` says which); 128 + the signal
        number when stopped by a signal.
        """
        try:
            self.start()
        except OSError as e:
            self.say(f'could not start a process: {e.strerror or e}')
            self.kill_all()
            return 1, None
        while True:
            signum = self.tick()
            if signum is not None:
                return self.stop_on_signal(signum), None
            failed = next((r for r in self.roles if r.failure()), None)
            if failed is not None:
                self.say(f'{failed.label} {failed.failure()}; stopping the job')
                self.stop(coordinated=False)
                return 1, failed
            if all(r.ended() for r in self.workers):
                return self.finish(), None
            time.sleep(0.1)

    def finish(self):
        """Every worker ended with 0: the scheduler and servers end by themselves, or never
        saw the workers join."""
        if self.wait(self.others, min(self.args.grace, 10.0)):
            return 0
        self.stop(coordinated=False)
        self.say('every worker ended, but the scheduler and servers still waited for them: the '
                 'command never joined the parameter server (train.py joins it with --kvstore '
                 'dist_sync, dist_device_sync or dist_async)')
        return 1

    def stop_on_signal(self, signum):
        name = signal.Signals(signum).name
        self.say(f'{name}: stopping the job: the workers finish a step (the same for all) and '
                 f'write their checkpoint (up to {self.args.grace:g} s); Ctrl-C again to stop '
                 'every process at once')
        if self.stop(coordinated=True):
            self.say(f'stopped by {name}: every process has ended')
        return 128 + signum

    def wait(self, roles, seconds):
        """Wait until every role of ``roles`` has ended, at most ``seconds``; True if they have.

        A further signal meanwhile kills every process at once (``killed``) and returns False.
        """
        deadline = time.monotonic() + seconds
        while any(r.running() for r in roles):
            signum = self.tick()
            if signum is not None and not self.killed:
                self.say(f'{signal.Signals(signum).name} again: killing every process now')
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
            workers = [r for r in self.workers if r.running() and not r.lost]
            step = max(r.steps for r in self.workers) + 2
            for r in workers:
                r.send(f'stop-at {step}')
            self.wait(workers, self.args.grace)
        for group in (self.workers, self.others):
            if group is self.others and coordinated:  # after the workers, they end by themselves
                self.wait(group, 2.0)
            alive = [r for r in group if r.running() and not r.lost]
            for r in alive:
                r.send('term')
            if not self.wait(alive, TERM_WAIT):
                for r in alive:
                    r.send('kill')
                self.wait(alive, TERM_WAIT)
            if self.killed:
                return False
        self.kill_all()
        return True

    def kill_all(self):
        """Kill every agent (and ssh client) still running here; the agents end their processes
        (on a lost host, the agent does so itself after --timeout)."""
        for r in self.roles:
            if r.running() and not r.lost:
                r.send('kill')
        deadline = time.monotonic() + 1.0
        for r in self.roles:
            if r.proc is None:
                continue
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if r.proc.poll() is None:
                try:
                    os.killpg(r.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                r.proc.wait()
        for t in self.threads:
            t.join(timeout=1)


def with_resume(command):
    """``command`` continuing from its checkpoint."""
    return command if '--resume' in command else [*command, '--resume']


def main(argv=None):
    """Run the script; return the exit status (0; 1 if a process failed or a host was lost; 2
    for bad input, the launcher's or, as a worker said with status 2, the command's; 128 + the
    signal number when stopped by SIGINT, SIGTERM or SIGHUP)."""
    signals = []

    def on_signal(signum, frame):  # pylint: disable=unused-argument
        signals.append(signum)
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in watched}
    try:
        try:
            args = build_parser().parse_args(argv)
            hosts, command = check_args(args)
        except LaunchError as e:
            print(f'error: {e}', file=sys.stderr)
            return 2
        argv = list(sys.argv[1:] if argv is None else argv)
        resume = common.command_line('launch', argv + ([] if '--resume' in command
                                                       else ['--resume']))
        return launch(args, hosts, command, signals, resume)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def launch(args, hosts, command, signals, resume=None):
    """Run the job, restarting it up to ``args.max_restarts`` times; return the exit status.

    ``resume``: the command line that continues the job, said after a stop by a signal when
    the workers keep checkpoints."""
    restarts = 0
    while True:
        roles = plan(args, hosts, command)
        try:
            port = preflight(args, roles, args.port)
        except LaunchError as e:
            if restarts == 0:
                print(f'error: {e}', file=sys.stderr)
                return 2
            print(f'launch: cannot restart: {e}', file=sys.stderr)
            return 1
        if signals:
            print('launch: interrupted: no process was started', file=sys.stderr)
            return 128 + signals[0]
        for role in roles:
            role.env['DMLC_PS_ROOT_PORT'] = str(port)
        job = Job(args, roles, signals)
        try:
            status, failed = job.run()
        except LaunchError as e:
            print(f'error: {e}', file=sys.stderr)
            return 2
        if status > 128 and resume and keeps_checkpoints(command):
            job.say(f'resume with: {resume}')
        if failed is not None and failed.kind == 'worker' and failed.status == 2:
            if args.max_restarts:
                job.say(f'{failed.label} stopped on bad input (status 2), which a restart would '
                        'meet again: not restarting')
            return 2  # the command's input is bad: its status
        if status != 1 or restarts >= args.max_restarts or signals:
            if status == 1 and args.max_restarts:
                job.say(f'gave up after {restarts} restart(s) (--max-restarts {args.max_restarts})')
            return status
        restarts += 1
        lost = {r.host for r in roles if r.lost or (r.failure() or '').startswith('its connection')}
        if lost and len(lost) < len(hosts):
            hosts = [h for h in hosts if h not in lost]
        command = with_resume(command)
        job.say(f'restart {restarts} of {args.max_restarts}: starting the job again from its '
                f'checkpoint on {len(hosts)} host(s) ({", ".join(hosts)})')


def start(launcher=None):
    """The program: ``gluon-multigpu-launch``, or ``scripts/launch.py`` (``launcher``); it loads
    no MXNet, so it sets no engine."""
    common.start(main, launcher, engine=False)


if __name__ == '__main__':
    start()

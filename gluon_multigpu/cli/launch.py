"""Start a training on MXNet's parameter server: scheduler, servers and workers, supervised.

The roles take their part and addresses from the documented DMLC_* variables
(DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER,
DMLC_NUM_WORKER). The scheduler and the servers are MXNet itself (importing
mxnet with DMLC_ROLE=server runs a server until the workers are done); every
worker runs the command given after ``--``. Every line a process prints comes
out with its role and number in front. If any process fails, the others are
stopped and the launcher exits with status 1 within --grace seconds, naming
the failed role; Ctrl-C or SIGTERM stops everything (status 130 or 143), with
one line. No process is left behind: the children die with the launcher even
if it is killed. Bad input (a command that does not exist, a host file without
hosts, a port in use) stops before any process starts, with one line and
status 2.
"""
import argparse
import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from . import common

EPILOG = """\
examples:
  %(prog)s -n 2 -s 1 -- python scripts/train.py --kvstore dist_sync --cpu-devices 1 \\
      --model simple-cnn --num-epochs 1 --data-dir ../shared/data/fashion-mnist
  %(prog)s -n 4 -s 2 --launcher ssh -H hosts.txt -- python scripts/train.py --kvstore dist_sync ...

The host file lists one host name or address per line (# starts a comment);
with ssh the scheduler runs on the first host, and servers and workers are
spread over the hosts in turn. Each host must reach the others and have the
same checkout at the same path (the current directory) with its virtual
environment.
"""
#: Seconds a process may take to end after SIGTERM before it is killed.
GRACE = 5.0


class LaunchError(Exception):
    """A bad command line: one line, exit status 2."""


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
                   help="the scheduler's port (default: a free one)")
    p.add_argument('--grace', type=common.positive_float, default=GRACE, metavar='SECONDS',
                   help='seconds a process gets to end after SIGTERM before SIGKILL '
                   f'(default: {GRACE:g})')
    p.add_argument('command', nargs=argparse.REMAINDER,
                   help='after --: the command every worker runs')
    return p


def read_hosts(path):
    """The hosts of a host file, one per line; raise ``LaunchError`` if there are none."""
    try:
        with open(path) as f:
            hosts = [line.split('#')[0].strip() for line in f]
    except OSError as e:
        raise LaunchError(f'--hostfile {path}: {e.strerror}; give a file with one host per '
                          'line') from None
    hosts = [h for h in hosts if h]
    if not hosts:
        raise LaunchError(f'--hostfile {path} lists no host; give one host per line')
    return hosts


def free_port(host='127.0.0.1'):
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(port, host='127.0.0.1'):
    """Raise ``LaunchError`` if ``port`` is taken on ``host``."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise LaunchError(f'--port {port} is in use ({e.strerror}); give another port or '
                              'leave --port out') from None


def plan(args):
    """Return ``[(label, host, env, argv)]``: scheduler, servers, workers, in start order."""
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not command:
        raise LaunchError('no command to run: give it after --, e.g. -- '
                          f'{common.program("train")} --kvstore dist_sync ...')
    if args.launcher == 'local' and shutil.which(command[0]) is None:
        raise LaunchError(f'the command {command[0]} is not a program that can be run here; '
                          'give an executable or one on the PATH, e.g. -- '
                          f'{common.program("train")} ...')
    if args.launcher == 'ssh':
        if not args.hostfile:
            raise LaunchError('--launcher ssh needs --hostfile FILE with the hosts')
        hosts = read_hosts(args.hostfile)
    else:
        if args.hostfile:
            raise LaunchError('--hostfile goes with --launcher ssh')
        hosts = ['127.0.0.1']
    if args.port is not None:
        if args.launcher == 'local':
            check_port(args.port)
        port = args.port
    else:
        port = free_port() if args.launcher == 'local' else 9091
    shared = {'DMLC_PS_ROOT_URI': hosts[0], 'DMLC_PS_ROOT_PORT': str(port),
              'DMLC_NUM_SERVER': str(args.num_servers), 'DMLC_NUM_WORKER': str(args.num_workers)}
    if args.launcher == 'local':
        shared['DMLC_NODE_HOST'] = '127.0.0.1'
    server = [sys.executable, '-c', 'import mxnet']  # MXNet runs the role, then exits
    procs = [('scheduler', hosts[0], dict(shared, DMLC_ROLE='scheduler'), server)]
    for i in range(args.num_servers):
        procs.append((f'server {i}', hosts[(i + 1) % len(hosts)],
                      dict(shared, DMLC_ROLE='server'), server))
    for i in range(args.num_workers):
        procs.append((f'worker {i}', hosts[(i + args.num_servers + 1) % len(hosts)],
                      dict(shared, DMLC_ROLE='worker', GLUON_MULTIGPU_WORKER=str(i)), command))
    return procs


def _die_with_parent():
    """In the child: get SIGKILL when the launcher dies, however it dies (Linux)."""
    os.setpgrp()
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn(label, host, env, argv, launcher):
    """Start one process; return it. With ssh the variables travel in the remote command."""
    if launcher == 'ssh':
        exports = ' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())
        remote = f'cd {shlex.quote(os.getcwd())} && env {exports} {shlex.join(argv)}'
        argv, env = ['ssh', '-o', 'BatchMode=yes', host, remote], {}
    proc = subprocess.Popen(argv, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent)
    proc.label = label
    return proc


def forward(proc, out, lock):
    """Copy ``proc``'s output to ``out``, each line behind the process's label."""
    for raw in iter(proc.stdout.readline, b''):
        with lock:
            out.write(f'[{proc.label}] {raw.decode(errors="replace")}')
            out.flush()


def stop_all(procs, grace):
    """SIGTERM every running process group, then SIGKILL what is left after ``grace`` s."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def supervise(procs, grace, out=sys.stdout):
    """Wait for the workers; return the exit status and a line on what ended the run.

    0 when every worker ended with 0 (the scheduler and servers then end by
    themselves, or are stopped after ``grace`` s); 1 as soon as any process
    fails, after stopping the others.
    """
    workers = [p for p in procs if p.label.startswith('worker')]
    while True:
        for p in procs:
            code = p.poll()
            if code not in (None, 0):
                stop_all(procs, grace)
                how = f'signal {signal.Signals(-code).name}' if code < 0 else f'status {code}'
                return 1, f'{p.label} failed ({how}); stopped the other processes'
        if all(p.poll() == 0 for p in workers):
            for p in procs:
                try:
                    p.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass
            stop_all(procs, grace)
            return 0, None
        time.sleep(0.1)


def main(argv=None):
    """Run the script; return the exit status (0; 1 if a process failed; 2 for bad input;
    130 or 143 when stopped by SIGINT or SIGTERM)."""
    signals = []  # the signal that interrupted the launcher; None once the processes ended

    def on_signal(signum, frame):  # pylint: disable=unused-argument
        # Only the first: a second would break into the stopping of the processes.
        if not signals:
            signals.append(signum)
            raise KeyboardInterrupt
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            args = build_parser().parse_args(argv)
            processes = plan(args)
        except LaunchError as e:
            print(f'error: {e}', file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print('launch: interrupted: no process was started', file=sys.stderr)
            return 128 + signals[0]
        return launch(args, processes, signals)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def launch(args, processes, signals):
    """Start ``processes`` (``plan``), supervise them; return the exit status.

    ``signals`` holds the signal that raised ``KeyboardInterrupt``, once one did.
    """
    procs, lock, threads = [], threading.Lock(), []
    try:
        for label, host, env, command in processes:
            try:
                procs.append(spawn(label, host, env, command, args.launcher))
            except OSError as e:  # the program vanished, no more processes allowed, ...
                stop_all(procs, args.grace)
                signals.append(None)
                print(f'launch: could not start {label} ({shlex.join(command)}): '
                      f'{e.strerror or e}; stopped the other processes', file=sys.stderr)
                return 1
            threads.append(threading.Thread(target=forward, args=(procs[-1], sys.stdout, lock),
                                            daemon=True))
            threads[-1].start()
        status, why = supervise(procs, args.grace)
        signals.append(None)  # every process has ended: a signal from now on changes nothing
    except KeyboardInterrupt:
        stop_all(procs, args.grace)
        status, why = 128 + signals[0], 'interrupted: stopped every process'
    for t in threads:
        t.join(timeout=1)
    if why:
        print(f'launch: {why}', file=sys.stderr)
    return status


def start(launcher=None):
    """The program: ``gluon-multigpu-launch``, or ``scripts/launch.py`` (``launcher``); it loads
    no MXNet, so it sets no engine."""
    common.start(main, launcher, engine=False)


if __name__ == '__main__':
    start()

"""Start a training on MXNet's parameter server: scheduler, servers and workers, supervised.

Each role (scheduler, servers, workers) is a process of this machine or of a
host reached over ssh or Slurm, given its ``DMLC_*`` variables; the launcher
watches them all and ends every one when any fails or when it is stopped, so
no process outlives the job.
"""
import argparse
import dataclasses
import os
import re
import sys

from . import console, messages
from .arguments import OneLineParser
from ..base.values import int_in, non_negative_float, positive_float
from ..errors import GluonMultiGPUError, flag
from ..base import signals
from ..filesafety import reading
from ..multihost.allocation import allocation
from ..multihost.plan import GRACE, TIMEOUT, LaunchError, Settings, keeps_checkpoints
from ..multihost.supervise import launch

EPILOG = """\
examples:
  %(prog)s -n 2 -s 1 -- python scripts/train.py --kvstore dist_sync --cpu-devices 1 \\
      --model simple-cnn --num-epochs 1 --data-dir ../shared/data/fashion-mnist
  %(prog)s -n 4 -s 2 --launcher ssh -H hosts.txt --max-restarts 3 -- \\
      python scripts/train.py --kvstore dist_sync --checkpoint-dir /nfs/run1 ...
  %(prog)s -n 3 -s 3 --launcher slurm -- python scripts/train.py --kvstore dist_sync ...
      (inside sbatch or salloc; examples/slurm/train.sbatch does it for you)

The host file lists one host name or address per line, optionally user@host
(# starts a comment; each host once; at most 1 MiB); with ssh the scheduler
runs on the first host, and
servers and workers on the hosts in turn. Each host must reach the others and
have the same checkout at the same path (the current directory) with the same
Python (this one's path), and be reachable with ssh without a prompt (ssh's
own configuration applies; --ssh-port, --ssh-identity and --ssh-config add
to it). With --max-restarts the checkpoint folder must be storage that every
host reads (rank 0 writes it, and after a restart rank 0 may be on another
host).

Every line comes out behind the process that printed it: [scheduler@HOST],
[server I@HOST], [worker I@HOST], and once a worker has joined the job,
[worker I@HOST as rank R]. I is the launcher's number for the process (0, 1, ...
in the order it starts them, which decides the host); R is the rank MXNet's
scheduler gave the worker as it joined (kv.rank: which part of each batch it
trains on; rank 0 prints the results and writes the checkpoint). The two are
set apart and need not agree: worker 1 may be rank 0.

Output lines over 64 KiB are cut, with "... [line cut: N bytes more]";
control characters from the processes are shown as ^X (ESC as ^[).
"""
#: The largest host file read (a host per line: far more hosts than any cluster has).
HOSTFILE_LIMIT = 1 << 20
#: A host as a host file may give it: [user@]name-or-address, never beginning with '-'.
HOST = re.compile(r'^(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9.:_-]*$')


def build_parser():
    """Return the argument parser of this script."""
    p = OneLineParser(description=__doc__.splitlines()[0], epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('-n', '--num-workers', type=int_in(1, 256), required=True, metavar='N',
                   help='worker processes, each running the command')
    p.add_argument('-s', '--num-servers', type=int_in(1, 256), default=1, metavar='N',
                   help='parameter-server processes (default: 1)')
    p.add_argument('--launcher', choices=['local', 'ssh', 'slurm'], default='local',
                   help='local: every process on this machine, on loopback; ssh: on the hosts of '
                   '--hostfile; slurm: as job steps (srun) on the nodes of the Slurm allocation it '
                   'runs in (sbatch, salloc) (default: local)')
    p.add_argument('-H', '--hostfile', metavar='FILE', help='hosts for --launcher ssh')
    p.add_argument('--port', type=int_in(1024, 65535), metavar='PORT',
                   help="the scheduler's port, checked free on its host (default: a free one)")
    p.add_argument('--max-restarts', type=int_in(0, 1000), default=0, metavar='N',
                   help='when a process fails or a host is lost, stop the job and start it again '
                   'with --resume, up to N times, without the hosts that were lost; the command '
                   'must give --checkpoint-dir (default: 0)')
    p.add_argument('--grace', type=positive_float, default=GRACE, metavar='SECONDS',
                   help='when the job is stopped, seconds the workers get to finish their step '
                   f'and write their checkpoint before SIGTERM and SIGKILL (default: {GRACE:g})')
    p.add_argument('--timeout', type=positive_float, default=TIMEOUT, metavar='SECONDS',
                   help='a host not heard from (heartbeats every 2 s), or a process stopped, for '
                   'this long is lost, and stops the job; an agent that does not hear the '
                   f'launcher for this long ends its process (default: {TIMEOUT:g})')
    p.add_argument('--step-timeout', type=non_negative_float, default=0.0,
                   metavar='SECONDS', help='when no worker has queued a step for this long (from '
                   "the first step reported; train.py's workers leave their evaluation out), the "
                   'job is hung (deadlocked, or waiting for a process that cannot answer): every '
                   'worker writes its Python stack, the launcher names the worker behind (the '
                   'fewest steps) with its host, rank and step, and stops the job with status 3; '
                   "a worker command's own --stall-timeout asks for the same, and the shorter "
                   'time wins (default: 0, not watched)')
    p.add_argument('--ssh-port', type=int_in(1, 65535), metavar='PORT',
                   help="the hosts' ssh port (default: ssh's configuration, else 22)")
    p.add_argument('--ssh-identity', metavar='FILE', help='the private key ssh logs in with')
    p.add_argument('--ssh-config', metavar='FILE',
                   help="an ssh configuration file instead of the user's")
    p.add_argument('command', nargs=argparse.REMAINDER,
                   help='after --: the command every worker runs')
    return p


# -- the command line checked: the hosts, the worker's command -------------------------------------

def read_hosts(path):
    """The hosts of a host file (at most ``HOSTFILE_LIMIT`` bytes), one per line; raise
    ``LaunchError`` if there are none, one is not a host name (nothing that ssh could take for
    an option; a name at most 253 bytes, a user at most 32) or a host comes twice (a file that
    cannot be read as text: ``reading``'s ``GluonMultiGPUError``)."""
    try:
        lines = reading.read_text(path, HOSTFILE_LIMIT, '--hostfile').splitlines()
    except FileNotFoundError:
        raise LaunchError(f'--hostfile {path}: No such file or directory; give a file with '
                          'one host per line') from None
    seen = {}  # each host's name: its line and how it was given
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
                              f'{seen[name][0]}; list each host once')
        seen[name] = number, host
    if not seen:
        raise LaunchError(f'--hostfile {path} lists no host; give one host per line')
    return [host for _, host in seen.values()]


def check_args(args):
    """Check the command line; return ``(hosts, command)``: the command every worker runs (after
    ``--``), and the hosts."""
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not command:
        raise LaunchError('no command to run: give it after --, e.g. -- '
                          f'{console.program("train")} --kvstore dist_sync ...')
    if args.max_restarts and not keeps_checkpoints(command):
        raise LaunchError('--max-restarts resumes the workers from their checkpoint: give the '
                          'command --checkpoint-dir DIR (on storage every host reads)')
    for name in ('hostfile', 'ssh_port', 'ssh_identity', 'ssh_config'):
        if args.launcher != 'ssh' and getattr(args, name) is not None:
            raise LaunchError(f'{flag(name)} goes with --launcher ssh' + (
                "; with --launcher slurm the hosts are the allocation's nodes"
                if args.launcher == 'slurm' else ''))
    if args.launcher == 'slurm':  # (``allocation`` refuses to run outside an allocation)
        args.nodes = tuple(allocation())
        return [address for address, _ in args.nodes], command
    if args.launcher == 'ssh':
        if not args.hostfile:
            raise LaunchError('--launcher ssh needs --hostfile FILE with the hosts')
        for name in ('ssh_identity', 'ssh_config'):
            if (path := getattr(args, name)) is not None and not os.path.isfile(path):
                raise LaunchError(f'{flag(name)} {path}: no such file; give an existing file')
        return read_hosts(args.hostfile), command
    return ['127.0.0.1'], command


# -- the program: signals taken note of, for the job to stop in order ------------------------------

def main(argv=None):
    """Run the script; return the exit status (0; 1 if a process failed or a host was lost; 2
    for bad input, the launcher's or, as a worker said with status 2, the command's; 3 when the
    workers' steps stalled; 128 + the signal number when stopped by SIGINT, SIGTERM or SIGHUP).

    Each stop signal's number (``base.signals.STOP_SIGNALS``; a SIGHUP
    ignored, as under ``nohup``, stays ignored) is appended to a list that the
    job takes as it watches: the first stops it in order, a second kills every
    process at once. Its stop lines are ``cli.messages``'.
    """
    taken = []
    previous = signals.install(lambda signum, frame: taken.append(signum))
    try:
        args = build_parser().parse_args(argv)
        hosts, command = check_args(args)
        # the launch's Settings: each of its fields the command line gives
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)
                 if hasattr(args, f.name)}
        return launch(Settings(**given, train_program=console.program('train')), hosts, command,
                      taken, console.resume_command('launch', argv), words=messages)
    except GluonMultiGPUError as e:  # a LaunchError, or the host file's reading
        print(f'error: {e}', file=sys.stderr)
        return 2
    finally:
        signals.restore(previous)


def start(launcher=None):
    """The program: ``gluon-multigpu-launch``, or ``scripts/launch.py`` (``launcher``); it loads
    no MXNet, so it sets no engine."""
    console.start(main, launcher, engine=False)


if __name__ == '__main__':
    start()

"""The faults of the failover study: what each one does to which host, and the job it hits.

The job (``launch_argv``): ``scripts/launch.py --launcher ssh -n 2 -s 1
--max-restarts 2 --timeout 5`` on a cluster of ``HOSTS`` hosts with
``scripts/train.py --kvstore dist_sync`` (``train_argv``). Each ``Fault``
of ``FAULTS`` is done to the cluster by ``inject``; ``job_processes`` says
what of the job is left on the hosts; ``estimate_seconds`` how long a run
should take. ``failover`` says what each figure of the study means.
"""
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Optional

from lab.hosts import cluster as _cluster
from gluon_multigpu.multihost.plan import ROLE, TERM_WAIT
from lab.studies.jobs import StudyError

__all__ = ['HOSTS', 'WORKERS', 'SERVERS', 'EPOCHS', 'STEPS', 'BATCH', 'FAULT_EPOCH', 'MID_STEP',
           'PROGRESS_INTERVAL', 'TIMEOUT', 'MAX_RESTARTS', 'TERM_WAIT', 'RUN_LIMIT', 'Fault',
           'FAULTS', 'train_argv', 'launch_argv', 'job_processes', 'inject', 'estimate_seconds']

#: Hosts of the cluster: the scheduler, the server and each worker alone on one.
HOSTS = 4
#: Workers and servers of the job (``launch.py -n 2 -s 1``).
WORKERS, SERVERS = 2, 1
#: Epochs of the job, steps of each (``NUM_TRAIN`` images in global batches of 2 x ``BATCH``).
EPOCHS, STEPS, BATCH = 3, 20, 64
NUM_TRAIN, NUM_TEST = WORKERS * BATCH * STEPS, 500
#: The epoch a fault comes in, and the first step of it at which it may come.
FAULT_EPOCH, MID_STEP = 2, 5
#: Seconds between a worker's progress lines (``train.py --progress-interval``).
PROGRESS_INTERVAL = 0.1
#: The launcher's --timeout (s) and --max-restarts for the faults that restart.
TIMEOUT, MAX_RESTARTS = 5.0, 2
#: Seconds a run may take before it is taken as hung and stopped.
RUN_LIMIT = 300.0
#: A guess of the reference's seconds until it is measured (for ``estimate_seconds``).
REFERENCE_GUESS_S = 12.0
#: Seconds a restart adds besides the epoch done again: the stop, the checks, MXNet loading.
RESTART_S = 5.0


@dataclass(frozen=True)
class Fault:
    """One fault: what is done (``action``) to which host, under which ``--max-restarts``.

    ``action`` is ``kill`` (SIGKILL to the process on ``host`` whose command
    line matches ``pattern``, its agent excepted), ``link-down`` or
    ``host-gone``. ``silent``: the launcher can only tell it by silence (the
    heartbeat timeout), not by an exit.
    """
    name: str
    label: str
    action: str
    host: int
    pattern: Optional[str] = None
    max_restarts: int = MAX_RESTARTS
    silent: bool = False


_SERVER = ' -c ' + re.escape(ROLE) + '$'
#: The faults of the study, by name, in the order they run.
FAULTS = {f.name: f for f in [
    Fault('worker-killed', 'worker killed (SIGKILL to train.py on host 2)', 'kill', 2,
          r'train\.py'),
    Fault('server-killed', 'server killed (SIGKILL on host 1)', 'kill', 1, _SERVER),
    Fault('scheduler-killed', 'scheduler killed (SIGKILL on host 0)', 'kill', 0, _SERVER),
    Fault('link-down', "link down (host 2's link cut, left down)", 'link-down', 2, silent=True),
    Fault('host-gone', 'host gone (every process of host 2 killed, its link cut)', 'host-gone',
          2),
    Fault('worker-killed-no-restart', 'worker killed, --max-restarts 0', 'kill', 2,
          r'train\.py', max_restarts=0),
]}


# -- the commands ----------------------------------------------------------------------------------

def train_argv(data_dir, checkpoint_dir, epochs=EPOCHS):
    """What every worker runs: ``train.py --kvstore dist_sync``, the simple CNN, one CPU context.

    ``epochs`` epochs of ``STEPS`` steps, a checkpoint after each in
    ``checkpoint_dir``, a progress line every ``PROGRESS_INTERVAL`` s.
    """
    return [*_cluster.program('train'), '--kvstore', 'dist_sync', '--cpu-devices', '1',
            '--model', 'simple-cnn', '--batch-size', str(BATCH), '--num-train', str(NUM_TRAIN),
            '--num-test', str(NUM_TEST), '--num-epochs', str(epochs), '--data-dir',
            os.fspath(data_dir), '--progress-interval', str(PROGRESS_INTERVAL),
            '--checkpoint-dir', os.fspath(checkpoint_dir)]


def launch_argv(hostfile, data_dir, checkpoint_dir, max_restarts=MAX_RESTARTS, timeout=TIMEOUT,
                epochs=EPOCHS):
    """The launcher's command: 2 workers and 1 server over ssh on the hosts of ``hostfile``."""
    return [*_cluster.program('launch'), '-n', str(WORKERS), '-s', str(SERVERS), '--launcher',
            'ssh', '-H', os.fspath(hostfile), '--max-restarts', str(max_restarts), '--timeout',
            f'{timeout:g}', '--', *train_argv(data_dir, checkpoint_dir, epochs)]


# -- the hosts -------------------------------------------------------------------------------------

def _cmdline(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace').strip()
    except OSError:
        return None


def job_processes(cl):
    """``({host: [command line, ...]}, sshd_sessions)``: the job's processes left on the hosts.

    Every process in a host's namespace but its sshd listener and sshd's
    session processes (``sshd: root@notty``); those are counted apart.
    """
    found, sshd = {}, 0
    for host, pids in cl.job_pids().items():
        for pid in pids:
            line = _cmdline(pid)
            if line is None or not line:  # gone, or a zombie
                continue
            if line.startswith('sshd'):
                sshd += 1
                continue
            found.setdefault(host, []).append(f'{pid} {line}')
    return found, sshd


def _pid_of(cl, host, pattern):
    """The process on host ``host`` whose command line matches ``pattern``, its agent excepted."""
    for pid in cl.pids(host):
        line = _cmdline(pid)
        if line and re.search(pattern, line) and 'gluon_multigpu.multihost.agent' not in line:
            return pid
    return None


def inject(cl, fault):
    """Do ``fault`` to the cluster now; return the time it began, or raise ``StudyError``."""
    if fault.action == 'kill':
        pid = _pid_of(cl, fault.host, fault.pattern)
        if pid is None:
            raise StudyError(f'{fault.name}: no process matching {fault.pattern!r} on host '
                             f'{fault.host}')
        began = time.monotonic()
        os.kill(pid, signal.SIGKILL)
    elif fault.action == 'link-down':
        began = time.monotonic()
        cl.link_down(fault.host)
    elif fault.action == 'host-gone':
        began = time.monotonic()
        cl.kill_host(fault.host)
    else:
        raise StudyError(f'{fault.name}: unknown action {fault.action!r}')
    return began


def estimate_seconds(fault, reference_s=None, timeout=TIMEOUT):
    """Seconds the run of ``fault`` (None: the reference) should take, watching the hosts included.

    The reference's duration (``REFERENCE_GUESS_S`` until measured), plus,
    for a fault, the detection (``timeout`` for a silent one), the stop and
    restart (``RESTART_S``) and the epoch done again; without restarts,
    half the reference.
    """
    ref = reference_s or REFERENCE_GUESS_S
    if fault is None:
        return ref
    detect = timeout if fault.silent else 0.5
    if not fault.max_restarts:
        return ref / 2 + detect + TERM_WAIT
    return ref + detect + RESTART_S + ref / EPOCHS

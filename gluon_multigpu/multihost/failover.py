"""What each fault costs a job on a cluster: time to detect and recover, result, what is left.

A ``cluster.Cluster`` of four hosts runs ``scripts/launch.py --launcher ssh
-n 2 -s 1 --max-restarts 2 --timeout 5`` with ``scripts/train.py --kvstore
dist_sync`` (the simple CNN on one CPU context per worker, three epochs of 20
steps of 2 x 64 images, a checkpoint every epoch in ``--checkpoint-dir``).
The launcher places the scheduler on host 0, the server on host 1 and the
two workers on hosts 2 and 3: each role alone on its host. One run goes
uninterrupted, the reference; then each fault runs on a fresh cluster, injected
in the middle of epoch 2 (at rank 0's first progress line of epoch 2 from
step ``MID_STEP`` on):

- ``worker-killed``: SIGKILL to train.py on host 2 (worker 0);
- ``server-killed``: SIGKILL to the server (``python -c 'import mxnet'``) on host 1;
- ``scheduler-killed``: SIGKILL to the scheduler on host 0;
- ``link-down``: host 2's link cut (``Cluster.link_down``) and left down to the end;
- ``host-gone``: every process of host 2 killed, its sshd too, then its link
  cut (``Cluster.kill_host``);
- ``worker-killed-no-restart``: as ``worker-killed``, with ``--max-restarts 0``.

Every time is counted from the fault: ``time.monotonic()`` in this process
just before the call that injects it. A line's time is when this process
read it from the launcher's output (stdout and stderr, each read by a thread).

- ``detect_s``: until the launcher's ``launch: ...; stopping the job`` line;
- ``recover_s``: until the first progress or epoch line of a worker after the
  launcher's ``launch: restart 1 of N`` line. A worker prints a progress line
  once it has completed a step and ``PROGRESS_INTERVAL`` s of the epoch have
  passed, so this is when the restarted job has completed its first steps,
  late by at most that interval and one step;
- ``lost_s``: the job's duration (the launcher's start to its exit) minus the
  reference's: what the fault cost the job in all, the epoch done again
  from the checkpoint included.

After the launcher has exited the hosts are watched for up to
``timeout + TERM_WAIT + 5`` s until none has a process of the job left: any
process in a host's namespace but its sshd listener and sshd's session
processes (``sshd: root@notty``, which sshd keeps until it has told the client
that its command ended: across a cut link, until TCP gives up; they are the
ssh server's, not the job's, and are counted apart in ``sshd_sessions``).

This module runs subprocesses only: it loads neither MXNet nor NumPy.
"""
import contextlib
import ctypes
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import cluster as _cluster
from ..run.output import atomic_write

__all__ = ['HOSTS', 'EPOCHS', 'STEPS', 'MID_STEP', 'TIMEOUT', 'TERM_WAIT', 'Fault', 'FAULTS',
           'StudyError', 'train_argv', 'launch_argv', 'parse_times', 'final_fingerprint',
           'estimate_seconds', 'job_processes', 'run_job', 'markdown_header', 'markdown_row',
           'summary', 'study']

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
#: Seconds an agent gives its process after SIGTERM before SIGKILL (``launch.TERM_WAIT``).
TERM_WAIT = 3.0
#: Seconds a run may take before it is taken as hung and stopped.
RUN_LIMIT = 300.0
#: A guess of the reference's seconds until it is measured (for ``estimate_seconds``).
REFERENCE_GUESS_S = 12.0
#: Seconds a restart adds besides the epoch done again: the stop, the checks, MXNet loading.
RESTART_S = 5.0


class StudyError(Exception):
    """The study cannot run here, or a run could not be made: one line."""


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


_SERVER = r' -c import mxnet$'
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


# -- reading the launcher's output ---------------------------------------------------------------

_STOPPING = re.compile(r'^launch: (.+); stopping the job$')
_RESTART = re.compile(r'^launch: restart (\d+) of (\d+): .* on (\d+) host\(s\) \(([^)]*)\)')
#: A line a worker prints once it has completed a step: a progress line, or the line of an
#: epoch it trained (with ``parameters``; the lines of the epochs a resumed run replays from
#: its checkpoint have none).
_WORKER_STEP = re.compile(r'^\[worker \d+@\S+(?: rank \d+)?\] (?:.*\bepoch \d+: \d+/\d+ batches|'
                          r'(?:rank \d+: )?epoch \d+/\d+: .*, parameters \w+$)')
_FINAL = re.compile(r'^\[worker \d+@\S+ rank 0\] epoch (\d+)/(\d+): .*, parameters (\w+)$')
_RESUMED = re.compile(r'^\[worker \d+@\S+ rank 0\] resuming from the checkpoint (.+?), in ')
_RANK0 = re.compile(r'^\[worker \d+@(\S+) rank 0\] ')
_PROGRESS = re.compile(r'^\[worker \d+@\S+ rank 0\] .*\bepoch (\d+): (\d+)/(\d+) batches')
_EPOCH_END = re.compile(r'^\[worker \d+@\S+ rank 0\] epoch (\d+)/\d+: ')


def final_fingerprint(text):
    """The parameter fingerprint of rank 0's line of the job's last epoch in ``text``, or None.

    None too when the job ended before its last epoch: then there are no final parameters.
    """
    found = [m.group(3) for m in map(_FINAL.match, text.splitlines())
             if m and m.group(1) == m.group(2)]
    return found[-1] if found else None


def parse_times(lines, fault_at=0.0):
    """What the launcher's output says about a fault at time ``fault_at``; a dict.

    ``lines`` are ``(time, line)`` pairs in seconds of one clock, the
    launcher's stdout (workers' lines, ``[worker 1@H rank 0] ...``) and stderr
    (its own, ``launch: ...``) together. Only lines from ``fault_at`` on
    count. Keys (None where the output does not say):

    - ``detect_s``: the first ``launch: ...; stopping the job`` line, from the fault;
    - ``detected_by``: what that line says, e.g. ``worker 0@198.18.7.4 rank 1
      failed (signal SIGKILL)``;
    - ``restarts``: the ``launch: restart K of N`` lines;
    - ``restart_s``: the first of them, from the fault;
    - ``restart_hosts``: the hosts it names;
    - ``recover_s``: the first progress or epoch line of any worker after
      that restart line, from the fault;
    - ``resumed_from``: where rank 0 resumed from (``epoch 1``);
    - ``rank0_before``, ``rank0_after``: the host of rank 0 before the fault
      and after the restart;
    - ``gave_up``: whether the launcher said it gave up (restarts spent);
    - ``fingerprint``: rank 0's last parameter fingerprint.
    """
    lines = sorted(lines, key=lambda tl: tl[0])
    times = dict.fromkeys(['detect_s', 'detected_by', 'restart_s', 'restart_hosts', 'recover_s',
                           'resumed_from', 'rank0_before', 'rank0_after'])
    times.update(restarts=0, gave_up=False, fingerprint=None)
    for t, line in lines:
        rank0 = _RANK0.match(line)
        if t < fault_at:
            if rank0:
                times['rank0_before'] = rank0.group(1)
            continue
        stopping, restart = _STOPPING.match(line), _RESTART.match(line)
        if stopping and times['detect_s'] is None:
            times['detect_s'], times['detected_by'] = t - fault_at, stopping.group(1)
        elif restart:
            times['restarts'] += 1
            if times['restart_s'] is None:
                times['restart_s'] = t - fault_at
                times['restart_hosts'] = [h.strip() for h in restart.group(4).split(',')]
        elif line.startswith('launch: gave up after'):
            times['gave_up'] = True
        elif times['restart_s'] is not None:
            if times['recover_s'] is None and _WORKER_STEP.match(line):
                times['recover_s'] = t - fault_at
            resumed = _RESUMED.match(line)
            if resumed and times['resumed_from'] is None:
                times['resumed_from'] = resumed.group(1)
            if rank0 and times['rank0_after'] is None:
                times['rank0_after'] = rank0.group(1)
    times['fingerprint'] = final_fingerprint('\n'.join(line for _, line in lines))
    return times


class _Output:
    """A process's stdout and stderr lines, each with the time it was read (two threads)."""

    def __init__(self, proc):
        self.lines, self._cond, self._open = [], threading.Condition(), 2
        self._threads = [threading.Thread(target=self._read, args=(s,), daemon=True)
                         for s in (proc.stdout, proc.stderr)]
        for t in self._threads:
            t.start()

    def _read(self, stream):
        for raw in iter(stream.readline, b''):
            with self._cond:
                self.lines.append((time.monotonic(), raw.decode(errors='replace').rstrip('\n')))
                self._cond.notify_all()
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    def wait_for(self, match, deadline):
        """The first ``(time, line)`` for which ``match(line)`` is true; None if the output ends
        or ``deadline`` (``time.monotonic()``) passes first."""
        seen = 0
        with self._cond:
            while True:
                for when, line in self.lines[seen:]:
                    if match(line):
                        return when, line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if not self._open or left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))

    def join(self, timeout=5.0):
        for t in self._threads:
            t.join(timeout)

    def snapshot(self):
        with self._cond:
            return list(self.lines)


def _mid_epoch(line):
    """Whether ``line`` is rank 0's, in ``FAULT_EPOCH`` from step ``MID_STEP`` on (or its end)."""
    m = _PROGRESS.match(line)
    if m:
        return int(m.group(1)) == FAULT_EPOCH and int(m.group(2)) >= MID_STEP
    m = _EPOCH_END.match(line)
    return bool(m) and int(m.group(1)) >= FAULT_EPOCH


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


class _HostWatch:
    """Watches one host from a fault on: ``empty_s``, the seconds until it first had no process
    of the job (``job_processes``), or None; a thread polling every 0.1 s until ``stop``."""

    def __init__(self, cl, host, since):
        self.cl, self.host, self.since, self.empty_s = cl, host, since, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._done.is_set():
            now = time.monotonic()
            if self.host not in job_processes(self.cl)[0]:
                self.empty_s = now - self.since
                return
            self._done.wait(0.1)

    def stop(self):
        self._done.set()
        self._thread.join()


def _inject(cl, fault):
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


def _die_with_parent():
    """In the launcher's process: a session of its own, and SIGKILL when this process dies."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _stop(proc):
    """End the launcher: SIGTERM (its ordered stop), SIGTERM again (every process at once), then
    SIGKILL after 10 s."""
    for _ in range(2):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            time.sleep(0.2)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- one run ---------------------------------------------------------------------------------------

def run_job(cl, fault, data_dir, workdir, reference=None, timeout=TIMEOUT, epochs=EPOCHS,
            limit=RUN_LIMIT, log=None):
    """Run the job on cluster ``cl`` (``HOSTS`` hosts) with ``fault`` (None: the reference); a row.

    The launcher runs from the checkout with the cluster's ``env()``; the
    checkpoint goes to a fresh folder in ``workdir`` (every host shares this
    machine's files). ``reference`` is the reference's row: its duration and
    fingerprint give ``lost_s`` and ``equal``. A run that lasts past ``limit``
    seconds is stopped and its row says ``hung``. ``log`` (a path) takes the
    command and every line of the launcher with its time from the start.
    Ctrl-C (or any exception) stops the launcher and passes on; the caller
    closes the cluster, which ends whatever is left.

    The row: ``fault``, ``label``, ``host`` (the address the fault hit),
    ``max_restarts``, ``timeout``, ``injected_at`` (e.g. ``epoch 2, step
    8/20``; None if it was not: ``error`` says why), ``parse_times``'s
    keys, ``duration_s``, ``lost_s`` (None unless the job restarted and
    ended with 0), ``status`` (the launcher's exit status, None if hung),
    ``hung``, ``equal`` (the final fingerprint against the reference's;
    None without either), ``host_empty_s`` (from the fault until its host
    first had no process of the job), ``left`` (``{host: [pid and command
    line]}`` still there after the wait), ``cleared_s`` (seconds after the
    launcher's exit until the last of the job's processes ended; None if
    some stayed), ``sshd_sessions``, ``load`` (the 1-minute load average
    before and after), ``problems`` (where the run ended otherwise than a
    fault handled well: not injected, not detected, not recovered, other
    final parameters, processes left, an unexpected exit status, hung).
    """
    name = fault.name if fault else 'reference'
    ckpt = os.path.join(workdir, f'ckpt-{name}')
    if os.path.exists(ckpt):
        raise StudyError(f'{ckpt} exists: give the study an empty folder')
    restarts = fault.max_restarts if fault else MAX_RESTARTS
    argv = launch_argv(cl.hostfile, data_dir, ckpt, restarts, timeout, epochs)
    row = {'fault': name, 'label': fault.label if fault else 'none (the reference)',
           'host': cl.hosts[fault.host] if fault else None, 'max_restarts': restarts,
           'timeout': timeout, 'injected_at': None, 'hung': False, 'error': None,
           'load': [round(os.getloadavg()[0], 2)]}
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=_cluster.checkout() or os.getcwd(), env=cl.env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    out = _Output(proc)
    fault_at, watch = None, None
    try:
        deadline = started + limit
        if fault:
            seen = out.wait_for(_mid_epoch, deadline)
            if seen is None:
                row['error'] = 'the job ended (or hung) before the fault could be injected'
            else:
                m = _PROGRESS.match(seen[1])
                try:
                    fault_at = _inject(cl, fault)
                except StudyError as e:
                    row['error'] = str(e)
                else:
                    row['injected_at'] = (
                        f'epoch {m.group(1)}, step {m.group(2)}/{m.group(3)}' if m
                        else f'end of epoch {_EPOCH_END.match(seen[1]).group(1)}')
                    watch = _HostWatch(cl, fault.host, fault_at)
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            row['hung'] = True
            _stop(proc)
    except BaseException:
        _stop(proc)
        raise
    finally:
        if watch:
            watch.stop()
    ended = time.monotonic()
    out.join()
    lines = out.snapshot()
    row.update(parse_times([(t - started, line) for t, line in lines],
                           (fault_at - started) if fault_at is not None else float('inf')))
    row['duration_s'] = ended - started
    row['status'] = None if row['hung'] else proc.returncode
    row['lost_s'] = (row['duration_s'] - reference['duration_s']
                     if reference and fault and fault.max_restarts and row['status'] == 0
                     else None)
    row['host_empty_s'] = watch.empty_s if watch else None
    ref_print = reference and reference.get('fingerprint')
    row['equal'] = (row['fingerprint'] == ref_print) if (ref_print and row['fingerprint']) \
        else None
    # what the job left on the hosts
    wait = timeout + TERM_WAIT + 5
    left, sshd = job_processes(cl)
    row['cleared_s'] = 0.0 if not left else None
    while left and time.monotonic() - ended < wait:
        time.sleep(0.1)
        left, sshd = job_processes(cl)
        if not left:
            row['cleared_s'] = time.monotonic() - ended
    row['left'], row['sshd_sessions'] = {str(h): p for h, p in left.items()}, sshd
    row['load'].append(round(os.getloadavg()[0], 2))
    row['problems'] = _problems(row, fault)
    if log:
        with atomic_write(log) as f:
            f.write(f'$ {shlex.join(argv)}\n')
            if fault_at is not None:
                f.write(f'# {fault.name} injected at {fault_at - started:.3f} s '
                        f'({row["injected_at"]})\n')
            for t, line in lines:
                f.write(f'{t - started:8.3f} {line}\n')
            f.write(f'# exit status {row["status"]} after {row["duration_s"]:.3f} s\n')
    return row


def _problems(row, fault):
    """What went otherwise than a fault handled well: a list of short phrases."""
    problems = []
    if row['error']:
        problems.append(row['error'])
    if row['hung']:
        problems.append('hung: stopped by the study')
    if row['left']:
        problems.append('processes left on the hosts')
    if fault is None:
        if row['status'] != 0:
            problems.append(f'exit status {row["status"]}')
        if row['fingerprint'] is None:
            problems.append('no final fingerprint')
        return problems
    if row['injected_at'] is None:
        return problems
    if row['detect_s'] is None:
        problems.append('not detected')
    expected = 0 if fault.max_restarts else 1
    if row['status'] is not None and row['status'] != expected:
        problems.append(f'exit status {row["status"]}, not {expected}')
    if fault.max_restarts:
        if row['recover_s'] is None:
            problems.append('not recovered')
        if row['equal'] is False:
            problems.append('final parameters differ from the reference')
        elif row['equal'] is None:
            problems.append('no final parameters to compare')
    return problems


# -- the table -------------------------------------------------------------------------------------

_COLUMNS = ['fault', 'injected', 'detected by', 'detect (s)', 'restart (s)', 'recover (s)',
            'lost (s)', 'exit', 'final parameters', "fault's host empty (s)", 'left on the hosts',
            'load']
_LEFT_ALIGNED = ('fault', 'injected', 'detected by', 'final parameters', 'left on the hosts')


def markdown_header():
    """The first two lines of the Markdown table (``markdown_row`` makes the others)."""
    aligns = ['---' if c in _LEFT_ALIGNED else '---:' for c in _COLUMNS]
    return f'| {" | ".join(_COLUMNS)} |\n| {" | ".join(aligns)} |\n'


def _sec(x, digits=1):
    return '-' if x is None else f'{x:.{digits}f}'


def markdown_row(row):
    """One line of the Markdown table for a row of ``run_job``."""
    reference = row['fault'] == 'reference'
    if row['fingerprint'] is None:
        params = '-'
    elif reference:
        params = f"`{row['fingerprint']}`"
    elif row['equal']:
        params = f"= reference (`{row['fingerprint']}`)"
    elif row['equal'] is False:
        params = f"**differ** (`{row['fingerprint']}`)"
    else:
        params = f"`{row['fingerprint']}`"
    if row['left']:
        left = '**' + '; '.join(f'host {h}: ' + ', '.join(p.split(None, 1)[-1][:60] for p in ps)
                                for h, ps in sorted(row['left'].items())) + '**'
    else:
        left = 'nothing'
        if row.get('cleared_s'):
            left += f' (after {row["cleared_s"]:.1f} s)'
    if row.get('sshd_sessions'):
        left += f', {row["sshd_sessions"]} sshd session(s)'
    if reference:
        detected_by, detect, restart, recover = '-', '-', '-', '-'
        lost = f"({row['duration_s']:.1f} s in all)"
    else:
        detected_by = row['detected_by'] or '**not detected**'
        detect, restart = _sec(row['detect_s']), _sec(row['restart_s'])
        recover, lost = _sec(row['recover_s']), _sec(row['lost_s'])
        if row['restarts'] > 1:
            restart += f" ({row['restarts']} restarts)"
    status = '**hung**' if row['hung'] else str(row['status'])
    cells = [row['label'], row['injected_at'] or ('-' if reference else '**not injected**'),
             detected_by, detect, restart, recover, lost, status, params,
             _sec(row.get('host_empty_s')), left, ' / '.join(f'{x:.1f}' for x in row['load'])]
    return '| ' + ' | '.join(c.replace('|', '/') for c in cells) + ' |\n'


def summary(row):
    """One line saying how a run went, for progress output."""
    if row['fault'] == 'reference':
        head = f"{row['duration_s']:.1f} s, exit {row['status']}, parameters {row['fingerprint']}"
    else:
        head = (f"detected in {_sec(row['detect_s'])} s ({row['detected_by'] or 'never'}), "
                f"restarted in {_sec(row['restart_s'])} s, recovered in {_sec(row['recover_s'])} "
                f"s, lost {_sec(row['lost_s'])} s, exit {row['status']}, parameters "
                f"{ {True: 'equal', False: 'DIFFER', None: '-'}[row['equal']] }, its host empty "
                f"after {_sec(row['host_empty_s'])} s")
    left = f"; LEFT: {row['left']}" if row['left'] else '; nothing left'
    problems = f"; PROBLEMS: {', '.join(row['problems'])}" if row['problems'] else ''
    return f"{head}{left} (load {' / '.join(map(str, row['load']))}){problems}"


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


# -- the study -------------------------------------------------------------------------------------

def study(faults, data_dir, workdir, timeout=TIMEOUT, say=None, log_dir=None, epochs=EPOCHS):
    """Run the reference, then each of ``faults`` (names of ``FAULTS``); yield each row as measured.

    Each run on a fresh cluster of ``HOSTS`` hosts, closed before the next
    (so a cut link or a host gone does not outlast its run). ``say`` takes
    progress lines on stderr: the run about to start, the estimate of its
    time and of the rest, then how it went. ``log_dir`` takes each run's
    log (``<fault>.log``). Raises ``StudyError`` where no cluster can be made.
    """
    say = say or (lambda line: None)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise StudyError(f'unknown fault(s) {", ".join(unknown)}; choose from {", ".join(FAULTS)}')
    ok, why = _cluster.available()
    if not ok:
        raise StudyError(f'no cluster can be made here: {why}')
    runs = [None] + [FAULTS[f] for f in faults]
    reference = None
    for i, fault in enumerate(runs):
        ref_s = reference['duration_s'] if reference else None
        rest = sum(estimate_seconds(f, ref_s, timeout) for f in runs[i:])
        what = fault.label if fault else 'the reference, uninterrupted'
        say(f'[{i + 1}/{len(runs)}] {fault.name if fault else "reference"}: {what}; about '
            f'{_duration(estimate_seconds(fault, ref_s, timeout))} for it, {_duration(rest)} '
            'with the rest')
        try:
            with _cluster.Cluster(HOSTS) as cl:
                log = os.path.join(log_dir, f'{fault.name if fault else "reference"}.log') \
                    if log_dir else None
                row = run_job(cl, fault, data_dir, workdir, reference, timeout, epochs, log=log)
        except _cluster.ClusterError as e:
            raise StudyError(str(e)) from None
        say(f'    {summary(row)}')
        if fault is None:
            if row['status'] != 0 or row['fingerprint'] is None:
                raise StudyError(f'the reference run failed (exit status {row["status"]}); '
                                 f'see {log or "its output"}')
            reference = row
        yield row


def _duration(seconds):
    return f'{seconds:.0f} s' if seconds < 90 else f'{seconds / 60:.0f} min'

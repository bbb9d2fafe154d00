"""One run of the failover study: the job launched on a cluster, a fault injected, figures read.

``run_job`` starts the launcher (``faults.launch_argv``) with the cluster's
``env()``, reads its lines with the time each was read (``Output``),
injects the fault (``faults.inject``) in the middle of ``FAULT_EPOCH``,
watches the fault's host until it is empty of the job, and makes the run's
row: ``parse_times``'s figures from the launcher's lines, the final
parameters against the reference's, what was left on the hosts, and the
problems. ``failover`` says what each figure means.
"""
import os
import re
import shlex
import signal
import subprocess
import threading
import time

from lab.hosts import cluster as _cluster
from gluon_multigpu.base import signals
from lab.studies.faults import EPOCHS, FAULT_EPOCH, MAX_RESTARTS, MID_STEP, RUN_LIMIT, TERM_WAIT, TIMEOUT, inject, job_processes, launch_argv
from lab.studies.jobs import StudyError, stop_launcher
from gluon_multigpu.filesafety.output import atomic_write

__all__ = ['parse_times', 'final_fingerprint', 'Output', 'run_job']


# -- reading the launcher's output ---------------------------------------------------------------

_STOPPING = re.compile(r'^launch: (.+); stopping the job$')
_RESTART = re.compile(r'^launch: restart (\d+) of (\d+): .* on (\d+) host\(s\) \(([^)]*)\)')
#: A line a worker prints once it has completed a step: a progress line, or the line of an
#: epoch it trained (with ``parameters``; the lines of the epochs a resumed run replays from
#: its checkpoint have none).
_WORKER_STEP = re.compile(r'^\[worker \d+@\S+(?: as rank \d+)?\] (?:.*\bepoch \d+: \d+/\d+ batches|'
                          r'(?:rank \d+: )?epoch \d+/\d+: .*, parameters \w+$)')
_FINAL = re.compile(r'^\[worker \d+@\S+ as rank 0\] epoch (\d+)/(\d+): .*, parameters (\w+)$')
_RESUMED = re.compile(r'^\[worker \d+@\S+ as rank 0\] resuming from the checkpoint (.+?), in ')
_RANK0 = re.compile(r'^\[worker \d+@(\S+) as rank 0\] ')
_PROGRESS = re.compile(r'^\[worker \d+@\S+ as rank 0\] .*\bepoch (\d+): (\d+)/(\d+) batches')
_EPOCH_END = re.compile(r'^\[worker \d+@\S+ as rank 0\] epoch (\d+)/\d+: ')


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
    launcher's stdout (workers' lines, ``[worker 1@H as rank 0] ...``) and stderr
    (its own, ``launch: ...``) together. Only lines from ``fault_at`` on
    count. Keys (None where the output does not say):

    (More: lab/NOTES.md.)
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


class Output:
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


def _die_with_parent():
    """A ``preexec_fn``: the launcher's process in a session of its own, and SIGKILL when this
    process dies."""
    return signals.dying_with_parent(signal.SIGKILL, first=os.setsid)


# -- one run ---------------------------------------------------------------------------------------

def run_job(cl, fault, data_dir, workdir, reference=None, timeout=TIMEOUT, epochs=EPOCHS,
            limit=RUN_LIMIT, log=None):
    """Run the job on cluster ``cl`` (``HOSTS`` hosts) with ``fault`` (None: the reference); a row.

    (More: lab/NOTES.md.)
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
    run = _launch(cl, fault, argv, row, limit)
    _figures(row, run, fault, reference)
    _left_on_hosts(cl, row, timeout + TERM_WAIT + 5, run['ended'])
    row['load'].append(round(os.getloadavg()[0], 2))
    row['problems'] = _problems(row, fault)
    if log:
        _write_log(log, argv, fault, row, run)
    return row


def _launch(cl, fault, argv, row, limit):
    """Run the launcher's ``argv`` on ``cl``, ``fault`` injected when due (``row`` takes where,
    or why not, and whether it hung); a dict: ``started``, ``ended``, ``fault_at`` (None if
    not injected), ``lines`` (time, line), ``status`` and ``watch`` (the fault's host)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=_cluster.checkout() or os.getcwd(), env=cl.env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_die_with_parent())
    out = Output(proc)
    fault_at, watch = None, None
    try:
        deadline = started + limit
        if fault:
            fault_at = _inject_when_due(cl, fault, out, deadline, row)
            watch = _HostWatch(cl, fault.host, fault_at) if fault_at is not None else None
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            row['hung'] = True
            stop_launcher(proc)
    except BaseException:
        stop_launcher(proc)
        raise
    finally:
        if watch:
            watch.stop()
    ended = time.monotonic()
    out.join()
    return {'started': started, 'ended': ended, 'fault_at': fault_at, 'lines': out.snapshot(),
            'status': None if row['hung'] else proc.returncode, 'watch': watch}


def _inject_when_due(cl, fault, out, deadline, row):
    """Wait for rank 0 in the middle of ``FAULT_EPOCH``, then inject ``fault``; return when it
    began, or None (``row['error']`` says why). ``row['injected_at']`` says where."""
    seen = out.wait_for(_mid_epoch, deadline)
    if seen is None:
        row['error'] = 'the job ended (or hung) before the fault could be injected'
        return None
    m = _PROGRESS.match(seen[1])
    try:
        fault_at = inject(cl, fault)
    except StudyError as e:
        row['error'] = str(e)
        return None
    row['injected_at'] = (f'epoch {m.group(1)}, step {m.group(2)}/{m.group(3)}' if m
                          else f'end of epoch {_EPOCH_END.match(seen[1]).group(1)}')
    return fault_at


def _figures(row, run, fault, reference):
    """Add the figures of the run (``_launch``'s) to ``row``, against the ``reference`` row."""
    started, fault_at = run['started'], run['fault_at']
    row.update(parse_times([(t - started, line) for t, line in run['lines']],
                           (fault_at - started) if fault_at is not None else float('inf')))
    row['duration_s'] = run['ended'] - started
    row['status'] = run['status']
    row['lost_s'] = (row['duration_s'] - reference['duration_s']
                     if reference and fault and fault.max_restarts and row['status'] == 0
                     else None)
    row['host_empty_s'] = run['watch'].empty_s if run['watch'] else None
    ref_print = reference and reference.get('fingerprint')
    row['equal'] = (row['fingerprint'] == ref_print) if (ref_print and row['fingerprint']) \
        else None


def _left_on_hosts(cl, row, wait, ended):
    """What the job left on the hosts, watched up to ``wait`` s after the launcher ``ended``:
    ``row``'s ``cleared_s``, ``left`` and ``sshd_sessions``."""
    left, sshd = job_processes(cl)
    row['cleared_s'] = 0.0 if not left else None
    while left and time.monotonic() - ended < wait:
        time.sleep(0.1)
        left, sshd = job_processes(cl)
        if not left:
            row['cleared_s'] = time.monotonic() - ended
    row['left'], row['sshd_sessions'] = {str(h): p for h, p in left.items()}, sshd


def _write_log(log, argv, fault, row, run):
    """The run's log: the command, the fault, every line of the launcher with its time."""
    started, fault_at = run['started'], run['fault_at']
    with atomic_write(log) as f:
        f.write(f'$ {shlex.join(argv)}\n')
        if fault_at is not None:
            f.write(f'# {fault.name} injected at {fault_at - started:.3f} s '
                    f'({row["injected_at"]})\n')
        for t, line in run['lines']:
            f.write(f'{t - started:8.3f} {line}\n')
        f.write(f'# exit status {row["status"]} after {row["duration_s"]:.3f} s\n')

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

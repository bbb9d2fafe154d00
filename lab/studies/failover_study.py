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

In lab/NOTES.md, under this module's name.
"""
import os

from lab.hosts import cluster as _cluster
from lab.studies.failover_report import markdown_header, markdown_row, summary
from lab.studies.failover_run import final_fingerprint, parse_times, run_job
from lab.studies.faults import BATCH, EPOCHS, FAULT_EPOCH, FAULTS, HOSTS, MAX_RESTARTS, MID_STEP, PROGRESS_INTERVAL, SERVERS, STEPS, TERM_WAIT, TIMEOUT, WORKERS, Fault, estimate_seconds, job_processes, launch_argv, train_argv
from lab.studies.jobs import StudyError, duration

__all__ = ['HOSTS', 'WORKERS', 'SERVERS', 'EPOCHS', 'STEPS', 'BATCH', 'FAULT_EPOCH', 'MID_STEP',
           'PROGRESS_INTERVAL', 'TIMEOUT', 'MAX_RESTARTS', 'TERM_WAIT', 'Fault', 'FAULTS',
           'StudyError', 'train_argv', 'launch_argv', 'parse_times', 'final_fingerprint',
           'estimate_seconds', 'job_processes', 'run_job', 'markdown_header', 'markdown_row',
           'summary', 'study']


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
            f'{duration(estimate_seconds(fault, ref_s, timeout))} for it, {duration(rest)} '
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

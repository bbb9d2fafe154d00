"""Measure the Slurm path on this machine: start-up to the first step, and a preemption.

Run as root from the checkout, with the Slurm and munge packages installed (as CI installs
them): ``python examples/slurm/measure.py --data-dir ../shared/data/fashion-mnist``. It makes a
cluster of network namespaces with a Slurm on it (``lab.hosts.slurm_cluster``), then

1. times the same small run started by ``sbatch examples/slurm/train.sbatch`` and by
   ``scripts/launch.py --launcher ssh`` on the same hosts: from the command to rank 0's first
   step (its first progress line);
2. submits the run, sends the batch script USR1 after the first step (what Slurm sends with
   ``--signal=B:USR1@S``), and times each stage from the signal as the job's output shows it:
   the workers stopped, the checkpoint written, the job requeued, restarted, resumed, ended;
   and says whether the final parameters and history equal the uninterrupted run's.

``--json FILE`` also writes these figures (seconds, with this machine and the date) to FILE,
the results file docs/distributed.md's Slurm tables are checked against.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402
from lab.hosts import cluster as gc
from lab.hosts import slurm_cluster as gs

STAGES = [('stop', r'the launcher stops the job: stopping after step'),
          ('checkpoint', r'rank 0\] interrupted by SIGTERM .*checkpoint in'),
          ('requeue', r'^preempted: .*requeueing'), ('restart', r'\(restart 1\)'),
          ('resume', r'rank 0\] resuming from the checkpoint'), ('end', r'rank 0\] test acc:')]


def run_args(data_dir, ck):
    return ['--kvstore', 'dist_sync', '--cpu-devices', '1', '--model', 'simple-cnn',
            '--batch-size', '64', '--num-train', '2304', '--num-test', '200', '--num-epochs', '2',
            '--data-dir', data_dir, '--checkpoint-dir', str(ck), '--progress-interval', '0.1']


def watch(out, patterns, proc, start, wait=True):
    """Seconds from ``start`` to each pattern's first line in ``out`` (all seen, or the process
    ended); then, if ``wait``, wait for the process to end."""
    seen = {}
    while True:
        ended = proc.poll() is not None
        text = out.read_text() if out.exists() else ''
        for name, pattern in patterns:
            if name not in seen and re.search(pattern, text, re.M):
                seen[name] = time.monotonic() - start
        if ended or len(seen) == len(patterns):
            break
        time.sleep(0.05)
    if wait:
        proc.wait()
    return seen


def last_epoch(text):
    found = re.findall(r'rank 0\] epoch 2/2: (loss .*)$', text, re.M)
    return re.sub(r', [\d.]+ s, \d+ samples/s', '', found[-1]) if found else None


def sbatch(slurm, out, argv):
    env = dict(slurm.env(), PYTHON=sys.executable)
    return subprocess.Popen(['sbatch', '--wait', '--parsable', f'--output={out}', '--nodes=2',
                             str(REPO / 'examples/slurm/train.sbatch'), *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--data-dir', required=True)
    p.add_argument('--json', metavar='FILE', help='also write the figures to FILE')
    args = p.parse_args()
    data_dir = str(Path(args.data_dir).resolve())
    first = [('first', r'rank 0\] .*epoch 1: \d+/\d+ batches')]
    with tempfile.TemporaryDirectory() as tmp, gc.Cluster(2) as cluster, \
            gs.SlurmCluster(cluster) as slurm:
        tmp = Path(tmp)
        start = time.monotonic()
        whole = sbatch(slurm, tmp / 'whole.out', run_args(data_dir, tmp / 'ck1'))
        slurm_first = watch(tmp / 'whole.out', first, whole, start)['first']
        start = time.monotonic()
        with open(tmp / 'ssh.out', 'w') as f:
            ssh = subprocess.Popen([sys.executable, 'scripts/launch.py', '-n', '2', '-s', '2',
                                    '--launcher', 'ssh', '-H', cluster.hostfile, '--',
                                    sys.executable, 'scripts/train.py',
                                    *run_args(data_dir, tmp / 'ck2')],
                                   cwd=REPO, env=cluster.env(), stdout=f, stderr=subprocess.STDOUT)
            ssh_first = watch(tmp / 'ssh.out', first, ssh, start)['first']
        print(f'start-up to the first step: sbatch {slurm_first:.1f} s, ssh launcher '
              f'{ssh_first:.1f} s')
        out = tmp / 'preempted.out'
        job = sbatch(slurm, out, run_args(data_dir, tmp / 'ck3'))
        watch(out, first, job, time.monotonic(), wait=False)  # at the first step
        job_id = slurm.run(['squeue', '-h', '-o', '%i']).stdout.split()[0]
        signalled = time.monotonic()
        slurm.run(['scancel', '--batch', '--signal=USR1', job_id])
        times = watch(out, STAGES, job, signalled)
        equal = last_epoch(out.read_text()) == last_epoch((tmp / 'whole.out').read_text())
        print('signal USR1 at 0 s; ' + ', '.join(f'{n} {t:.1f} s' for n, t in times.items()) +
              f'; equal to the uninterrupted run: {"yes" if equal else "no"}')
    if args.json:
        with atomic_write(args.json) as f:
            json.dump({'startup': {'sbatch': slurm_first, 'ssh': ssh_first}, 'preemption': times,
                       'equal': equal, **stamp()}, f, indent=2)
            f.write('\n')


if __name__ == '__main__':
    main()

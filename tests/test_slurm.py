"""A real Slurm on one machine (``multihost.slurm``), and training jobs run under it.

One Slurm of three hosts (network namespaces, a slurmd each; munge and
slurmctld here) is shared by the module's tests (``slurm_fixture``). Skipped,
with the reason, where Slurm cannot be had (not root, no slurmctld, ...).
"""
import json
import re
import os
import signal
import subprocess
import sys
import time

import pytest

from slurm_fixture import skip_unless_slurm, slurm_cluster  # noqa: F401  (fixture)
from conftest import REPO, alive, wait_bounded
from gluon_multigpu.multihost import cluster as gc, slurm as gs


def cmdline(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace')
    except OSError:
        return ''


def slurm_pids(folder):
    """The live processes whose command line names a file of ``folder``."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir('/proc')))
            if folder + '/' in cmdline(pid) and alive(pid)]


def nothing_left(slurm, timeout=30):
    """Whether no job process is left on any host within ``timeout`` s (slurmd and sshd aside)."""
    deadline = time.monotonic() + timeout
    while slurm.job_pids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_srun_runs_a_task_on_each_host_at_its_own_address(slurm_cluster):
    done = slurm_cluster.run(['srun', '-N3', '-l', 'sh', '-c',
                              'echo $SLURMD_NODENAME $(ip -4 -o addr show eth0)'])
    assert done.returncode == 0, done.stderr
    seen = {}
    for line in done.stdout.splitlines():
        words = line.split()  # "0: n0 2: eth0 inet 198.18.K.2/24 ..."
        seen[words[1]] = words[words.index('inet') + 1].split('/')[0]
    assert seen == slurm_cluster.addresses


def test_close_ends_every_daemon_and_job_and_removes_the_folder():
    skip_unless_slurm()
    with gc.Cluster(1) as cluster:
        slurm = gs.SlurmCluster(cluster)
        daemons = [p.pid for p in slurm._procs.values()]  # pylint: disable=protected-access
        job = slurm.run(['sbatch', '--parsable', '--wrap', 'sleep 300'])
        assert job.returncode == 0, job.stderr
        assert all(alive(pid) for pid in daemons)
        slurm.close()
        assert not any(alive(pid) for pid in daemons)
        assert cluster.job_pids() == {}  # the job's step, its shell and sleep: gone
        assert not slurm_pids(slurm.folder) and not os.path.exists(slurm.folder)
        slurm.close()  # again: nothing


def test_slurm_of_a_killed_process_is_ended_by_the_next():
    skip_unless_slurm()
    code = ('import json, time\n'
            'from gluon_multigpu.multihost import cluster, slurm\n'
            'c = cluster.Cluster(1)\n'
            's = slurm.SlurmCluster(c)\n'
            'print(json.dumps(dict(folder=s.folder, pids=[p.pid for p in s._procs.values()])),'
            ' flush=True)\n'
            'time.sleep(60)\n')
    creator = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE,
                               text=True)
    try:
        made = json.loads(creator.stdout.readline())
    finally:
        creator.send_signal(signal.SIGKILL)
        wait_bounded(creator, 10)
    gc.remove_stale()
    gs.remove_stale()
    assert not slurm_pids(made['folder']) and not os.path.exists(made['folder'])


def test_remove_stale_ends_a_daemon_of_no_live_cluster(tmp_path):
    """A munged whose folder is no live cluster's (its creator died without the SIGTERM that
    ends it with its creator) is ended by ``remove_stale``."""
    skip_unless_slurm()
    folder = tmp_path / 'slurm'
    folder.mkdir(mode=0o700)
    (folder / 'munge.key').write_bytes(os.urandom(1024))
    (folder / 'munge.key').chmod(0o600)
    munged = subprocess.Popen([gs.MUNGED, '-F', '--force', f'--key-file={folder}/munge.key',
                               f'--socket={folder}/munge.socket', f'--pid-file={folder}/pid',
                               f'--log-file={folder}/log', f'--seed-file={folder}/seed'],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert munged.pid in gs.remove_stale()
        assert wait_bounded(munged, 10) == -signal.SIGKILL
    finally:
        munged.kill()
        munged.wait()


SBATCH = str(REPO / 'examples' / 'slurm' / 'train.sbatch')
LAUNCH, TRAIN = str(REPO / 'scripts' / 'launch.py'), str(REPO / 'scripts' / 'train.py')


def small_run(data_dir, *extra):
    """train.py's arguments for a tiny dist_sync run: 2 steps of 3 x 64 per epoch."""
    return ['--kvstore', 'dist_sync', '--cpu-devices', '1', '--model', 'simple-cnn',
            '--batch-size', '64', '--num-train', '384', '--num-test', '200', '--data-dir',
            str(data_dir), *extra]


def sbatch(slurm, out, *args, timeout=240):
    """``sbatch --wait`` from the checkout, its output to ``out``; (its CompletedProcess, the
    job's output)."""
    env = slurm.env()
    env['PYTHON'] = sys.executable
    done = slurm.run(['sbatch', '--wait', '--parsable', f'--output={out}', *args], cwd=REPO,
                     env=env, timeout=timeout)
    text = out.read_text() if out.exists() else ''
    return done, text


def test_sbatch_trains_on_every_node_and_prints_the_book_line(slurm_cluster, fashion_dir,
                                                               tmp_path):
    out = tmp_path / 'job.out'
    done, text = sbatch(slurm_cluster, out, '--nodes=3', SBATCH,
                        *small_run(fashion_dir, '--num-epochs', '1'))
    assert done.returncode == 0, done.stderr + text[-3000:]
    assert re.search(r'^\[worker \d@[\d.]+ rank 0\] test acc: [\d.]+, [\d.]+ sec/epoch on 3 '
                     r'workers x \[cpu\(0\)\]$', text, re.M), text[-3000:]
    hosts = set(re.findall(r'^\[(?:scheduler|server \d|worker \d)@([\d.]+)', text, re.M))
    assert hosts == set(slurm_cluster.addresses.values())
    assert nothing_left(slurm_cluster)


# A worker that joins the parameter server and says so: the job, without the training.
JOIN = ('import mxnet as mx; kv = mx.kv.create("dist_sync"); '
        'print("joined rank", kv.rank, "of", kv.num_workers, flush=True)')


def test_salloc_then_the_launcher_runs_the_roles_as_job_steps(slurm_cluster, tmp_path):
    done = slurm_cluster.run(['salloc', '-N2', sys.executable, LAUNCH, '-n', '2', '-s', '2',
                              '--launcher', 'slurm', '--', sys.executable, '-c', JOIN],
                             cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    first, second = slurm_cluster.cluster.hosts[:2]
    # the scheduler and server 1 on the first node, server 0 on the second; the workers in
    # turn after them (launch.plan): worker 0 on the second, worker 1 on the first
    labels = set(re.findall(r'^\[([^\]]+)\] joined rank (\d) of 2$', done.stdout, re.M))
    assert {label.split(' rank')[0] for label, _ in labels} == {f'worker 0@{second}',
                                                                f'worker 1@{first}'}
    assert {rank for _, rank in labels} == {'0', '1'}
    assert nothing_left(slurm_cluster)  # every step ended with the job


@pytest.mark.parametrize('flags, words', [
    ([], 'runs inside a Slurm allocation'),
    (['-H', 'hosts.txt'], '--hostfile goes with --launcher ssh'),
])
def test_the_slurm_launcher_outside_an_allocation_or_with_hosts_is_bad_input(flags, words):
    env = {k: v for k, v in os.environ.items() if not k.startswith('SLURM_')}
    done = subprocess.run([sys.executable, LAUNCH, '-n', '1', '--launcher', 'slurm', *flags, '--',
                           sys.executable, '-c', 'pass'], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ''
    assert done.stderr.startswith('error: ') and words in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr

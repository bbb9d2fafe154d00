"""A real Slurm on one machine (``multihost.slurm``), and training jobs run under it.

One Slurm of three hosts (network namespaces, a slurmd each; munge and
slurmctld here) is shared by the module's tests (``slurm_fixture``). Skipped,
with the reason, where Slurm cannot be had (not root, no slurmctld, ...).
"""
import json
import os
import signal
import subprocess
import sys

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

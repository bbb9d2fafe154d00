"""A real Slurm on one machine (``multihost.slurm``), and training jobs run under it.

One Slurm of three hosts (network namespaces, a slurmd each; munge and
slurmctld here) is shared by the module's tests (``slurm_fixture``); the
last test kills a host. What is checked: tasks run on each host at its own
address; the Slurm leaves nothing behind however its creator ends; the
launcher's slurm placement under salloc and sbatch (examples/slurm/
train.sbatch: the book's line, every host used, nothing left); USR1 (what
--signal=B:USR1@S sends) stops, checkpoints, requeues and resumes to the
uninterrupted result; scancel and a lost node end the job within a bound.
Skipped, with the reason, where Slurm cannot be had (not root, no slurmctld,
...): CI installs it.
"""
import json
import random
import re
import shlex
import os
import signal
import subprocess
import sys

import pytest

from slurm_fixture import skip_unless_slurm, slurm_cluster  # noqa: F401  (fixture)
from conftest import REPO, alive, descendants, wait_bounded
from process_state import cmdline, wait_until
from lab.hosts import cluster as gc
from lab.hosts import slurm_cluster as gs


def slurm_pids(folder):
    """The live processes whose command line names a file of ``folder``."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir('/proc')))
            if folder + '/' in cmdline(pid) and alive(pid)]


def nothing_left(slurm, timeout=30):
    """Whether no job process is left on any host within ``timeout`` s (slurmd and sshd aside)."""
    try:
        wait_until(None, 'no job process left', lambda: not slurm.job_pids(), timeout, 0.1)
    except AssertionError:
        return False
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


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
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


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_slurm_of_a_killed_process_is_ended_by_the_next():
    skip_unless_slurm()
    code = ('import json, time\n'
            'from lab.hosts import cluster, slurm_cluster as slurm\n'
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
        # munged up (its socket made) before it is looked for: a daemon still starting, or one
        # that ended at once, says nothing of remove_stale
        log = lambda: (folder / 'log').read_text()[-500:] if (folder / 'log').exists() else ''  # noqa: E731
        wait_until(munged, lambda: f'munged up (its socket made); its log: {log()}',
                   lambda: (folder / 'munge.socket').exists(), 10)
        assert munged.pid in gs.remove_stale(), log()
        assert wait_bounded(munged, 10) == -signal.SIGKILL
    finally:
        munged.kill()
        munged.wait()


SBATCH = str(REPO / 'examples' / 'slurm' / 'train.sbatch')
LAUNCH, TRAIN = str(REPO / 'scripts' / 'launch.py'), str(REPO / 'scripts' / 'train.py')


def small_run(data_dir, ck):
    """train.py's arguments for the small dist_sync run of these tests, on two nodes: 2 epochs
    of 18 steps of 2 x 64, a checkpoint every epoch; few enough steps to be quick, enough that a
    signal after the first stops it before its end (in epoch 1 or 2, or between them: about
    0.1 s a step with one OpenMP thread a worker; with 6 steps an epoch the stop came after
    epoch 1 or missed the run). Two
    workers, as in the other tests that compare runs: the servers add two workers' gradients
    in either order to the same sum, three in an order that varies from run to run (the last
    bits of the parameters differ between two uninterrupted runs)."""
    return ['--kvstore', 'dist_sync', '--cpu-devices', '1', '--model', 'simple-cnn',
            '--batch-size', '64', '--num-train', '2304', '--num-test', '200', '--num-epochs', '2',
            '--data-dir', str(data_dir), '--checkpoint-dir', str(ck), '--progress-interval', '0.1']


def submit(slurm, out, *args):
    """``sbatch`` from the checkout, the job's output to ``out``: the job's id."""
    env = slurm.env()
    env['PYTHON'] = sys.executable
    done = slurm.run(['sbatch', '--parsable', f'--output={out}', *args], cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(';')[0]


#: The states of a job that has ended (a requeued job is PENDING again, not ended).
ENDED = {'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'PREEMPTED', 'BOOT_FAIL',
         'DEADLINE', 'OUT_OF_MEMORY'}


def job_state(slurm, job_id):
    """``(state, exit code)`` of the job as ``scontrol`` shows it (``ExitCode=0:0``)."""
    shown = slurm.run(['scontrol', '-o', 'show', 'job', job_id]).stdout
    state, code = re.search(r'\bJobState=(\S+)', shown), re.search(r'\bExitCode=(\S+)', shown)
    return (state.group(1) if state else '?'), (code.group(1) if code else '?')


def wait_job(slurm, job_id, out, timeout=240):
    """Wait until the job has ended (polled every 0.2 s: ``sbatch --wait`` looks only every 10
    s); its ``(state, exit code)``. Fails after ``timeout`` s."""
    state = []

    def ended():
        state[:] = job_state(slurm, job_id)
        return state[0] in ENDED
    wait_until(None, lambda: f'the job ended ({state}; {tail(out)})', ended, timeout, 0.2)
    return tuple(state)


def tail(out):
    """The end of the job's output file (or nothing, before it exists)."""
    return out.read_text()[-3000:] if out.exists() else ''


def wait_for(out, pattern, slurm, job_id, timeout=180):
    """Wait until the job's output ``out`` has a line matching ``pattern``; fail if the job
    ends first or ``timeout`` s pass."""
    def seen():
        if out.exists() and re.search(pattern, out.read_text(), re.M):
            return True
        state = job_state(slurm, job_id)
        assert state[0] not in ENDED, (state, tail(out))
        return False
    wait_until(None, f'a line {pattern!r}', seen, timeout, 0.2)


def last_epoch(text):
    """Rank 0's last epoch line, from its loss on (its history's last entry and parameters)."""
    found = re.findall(r'rank 0\] epoch 2/2: (loss .*)$', text, re.M)
    assert found, text[-3000:]
    return re.sub(r', [\d.]+ s, \d+ samples/s', '', found[-1])  # the times differ


@pytest.fixture(scope='module')
def uninterrupted(slurm_cluster, fashion_dir, tmp_path_factory):
    """The output of the small run submitted with sbatch on two nodes, uninterrupted."""
    tmp = tmp_path_factory.mktemp('whole')
    out = tmp / 'job.out'
    job = submit(slurm_cluster, out, '--nodes=2', SBATCH, *small_run(fashion_dir, tmp / 'ck'))
    assert wait_job(slurm_cluster, job, out) == ('COMPLETED', '0:0'), out.read_text()[-3000:]
    return out.read_text()


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_sbatch_trains_on_every_node_and_prints_the_book_line(slurm_cluster, uninterrupted):
    text = uninterrupted
    assert re.search(r'^\[worker \d@[\d.]+ as rank 0\] test acc: [\d.]+, [\d.]+ sec/epoch on 2 '
                     r'workers x \[cpu\(0\)\]$', text, re.M), text[-3000:]
    hosts = set(re.findall(r'^\[(?:scheduler|server \d|worker \d)@([\d.]+)', text, re.M))
    assert hosts == set(slurm_cluster.cluster.hosts[:2])
    assert nothing_left(slurm_cluster)


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_usr1_stops_checkpoints_requeues_and_the_requeued_job_ends_equal(
        slurm_cluster, fashion_dir, tmp_path, uninterrupted):
    out = tmp_path / 'job.out'
    job = submit(slurm_cluster, out, '--nodes=2', SBATCH, *small_run(fashion_dir, tmp_path / 'ck'))
    wait_for(out, r'rank 0\] .*epoch 1: \d+/\d+ batches', slurm_cluster, job)  # a step done
    # what Slurm does at --signal=B:USR1@S before the time limit, or on preemption
    signalled = slurm_cluster.run(['scancel', '--batch', '--signal=USR1', job])
    assert signalled.returncode == 0, signalled.stderr
    assert wait_job(slurm_cluster, job, out) == ('COMPLETED', '0:0'), out.read_text()[-3000:]
    text = out.read_text()
    assert re.search(r'rank 0\] interrupted by SIGTERM (in epoch \d after \d+ batch|after epoch 1, '
                     r'before)', text), \
        text[-3000:] + signalled.stdout + signalled.stderr
    assert 'preempted: the checkpoint is written; requeueing job' in text, text[-3000:]
    assert re.search(r'job \d+ \(restart 1\)', text), text[-3000:]
    assert last_epoch(text) == last_epoch(uninterrupted)
    assert nothing_left(slurm_cluster)


# A worker that joins the parameter server and says so: the job, without the training.
JOIN = ('import gluon_multigpu, mxnet as mx; kv = mx.kv.create("dist_sync"); '
        'print("joined rank", kv.rank, "of", kv.num_workers, flush=True)')


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_salloc_then_the_launcher_runs_the_roles_as_job_steps(slurm_cluster, tmp_path):
    done = slurm_cluster.run(['salloc', '-N3', sys.executable, LAUNCH, '-n', '3', '-s', '3',
                              '--launcher', 'slurm', '--', sys.executable, '-c', JOIN],
                             cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    hosts = slurm_cluster.cluster.hosts
    # the scheduler on the first node, server i on node (i + 1) % 3, then the workers in turn
    # (launch.plan): worker i on node (i + 4) % 3
    joined = set(re.findall(r'^\[worker (\d)@([\d.]+)\] joined rank (\d) of 3$', done.stdout,
                            re.M))
    assert {(w, host) for w, host, _ in joined} == {(str(i), hosts[(i + 4) % 3]) for i in range(3)}
    assert sorted(rank for _, _, rank in joined) == ['0', '1', '2']
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



# A worker that joins, says so, and waits: a job that runs until it is stopped.
WAITER = JOIN + '; import time; time.sleep(600)'
#: Seconds within which a job that lost a node ends (launched with --timeout 5: the launcher
#: gives the host up after 5 s of silence; Slurm takes the node as down after its SlurmdTimeout,
#: 10 s here): the bound the docs state, with room for a loaded machine.
LOST_BOUND = 60


def waiting_job(slurm, out, *flags):
    """A batch job of three nodes whose launcher runs three waiting workers; its id, returned
    once every worker has joined."""
    launch = [sys.executable, LAUNCH, '-n', '3', '-s', '3', '--launcher', 'slurm', *flags, '--',
              sys.executable, '-c', WAITER]
    job = submit(slurm, out, '--nodes=3', '--requeue', '--wrap', shlex.join(launch))
    wait_for(out, r'(?s)(joined rank.*){3}', slurm, job)
    return job


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_scancel_ends_every_process_on_every_node(slurm_cluster, tmp_path):
    out = tmp_path / 'job.out'
    job = waiting_job(slurm_cluster, out)
    assert slurm_cluster.job_pids().keys() == {0, 1, 2}
    assert slurm_cluster.run(['scancel', job]).returncode == 0
    assert wait_job(slurm_cluster, job, out, 60)[0] == 'CANCELLED'
    assert nothing_left(slurm_cluster)  # Slurm's KillWait (5 s here), then SIGKILL


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_scancel_batch_term_stops_the_job_in_order_without_a_requeue(slurm_cluster, fashion_dir,
                                                                      tmp_path):
    """SIGTERM to the batch script alone: the launcher stops the job in order, rank 0 writes its
    checkpoint, and the job ends, not requeued."""
    out = tmp_path / 'job.out'
    job = submit(slurm_cluster, out, '--nodes=2', SBATCH, *small_run(fashion_dir, tmp_path / 'ck'))
    wait_for(out, r'rank 0\] .*epoch 1: \d+/\d+ batches', slurm_cluster, job)
    assert slurm_cluster.run(['scancel', '--batch', '--signal=TERM', job]).returncode == 0
    state = wait_job(slurm_cluster, job, out, 60)
    text = out.read_text()
    assert state == ('FAILED', '143:0') and not requeued(slurm_cluster, job), (state, text[-3000:])
    assert re.search(r'rank 0\] interrupted by SIGTERM (in epoch \d after \d+ batch|after epoch 1, '
                     r'before).*checkpoint in',
                     text), text[-3000:]
    assert re.search(r'^launch: stopped by SIGTERM: every process has ended$', text, re.M)
    assert 'requeueing' not in text
    assert nothing_left(slurm_cluster)


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_an_agent_killed_on_its_node_leaves_nothing_of_its_worker(slurm_cluster, tmp_path):
    out = tmp_path / 'job.out'
    # a child in the worker's session, and a double-forked daemon in a session of its own
    child, daemon = (f'30{i}.{random.randrange(10**6)}' for i in (5, 6))
    script = f'sleep {child} & (setsid sleep {daemon} &); echo ready; wait'
    launch = [sys.executable, LAUNCH, '-n', '1', '-s', '1', '--launcher', 'slurm', '--',
              '/bin/bash', '-c', script]
    job = submit(slurm_cluster, out, '--nodes=2', '--wrap', shlex.join(launch))
    wait_for(out, r'^\[worker 0@\S+\] ready$', slurm_cluster, job)
    everywhere = lambda: [p for pids in slurm_cluster.job_pids().values() for p in pids]
    mine = lambda: [p for p in everywhere() if cmdline(p) in (f'sleep {child} ',
                                                              f'sleep {daemon} ')]
    wait_until(None, 'both sleeps running', lambda: len(mine()) == 2, 30, 0.1)
    agent, = [p for p in everywhere() if daemon in cmdline(p) and '--keeper' not in cmdline(p)
              and cmdline(p).startswith(f'{sys.executable} -m gluon_multigpu.multihost.agent ')]
    tree = descendants(agent)  # its keeper, bash, the two sleeps
    os.kill(agent, signal.SIGKILL)  # on the worker's node
    left = lambda: mine() + [p for p in tree if alive(p)]
    try:  # by its keeper, not by Slurm as the job ends
        wait_until(None, 'every process of the worker ended', lambda: not left(), 10, 0.1)
    finally:
        for pid in left():
            os.kill(pid, signal.SIGKILL)
    state = wait_job(slurm_cluster, job, out, 60)
    text = out.read_text()
    assert state == ('FAILED', '1:0'), (state, text[-3000:])
    assert re.search(r'^launch: worker 0@\S+ its agent ended \(signal SIGKILL\); stopping the '
                     r'job$', text, re.M), text[-3000:]
    assert nothing_left(slurm_cluster)


@pytest.mark.slow  # jobs on a Slurm of its own: the full suite's
def test_a_lost_node_ends_the_job_within_the_bound(slurm_cluster, tmp_path):
    """The last of the module's tests to use its Slurm: it kills host 2. The launcher gives the
    host up and stops the job (or Slurm requeues it) within the bound; nothing is left on the
    other nodes."""
    out = tmp_path / 'job.out'
    job = waiting_job(slurm_cluster, out, '--timeout', '5')
    gone = re.escape(slurm_cluster.cluster.hosts[2])
    given_up = rf'^launch: (scheduler|server \d|worker \d)@{gone} not heard from .*; stopping the job'
    slurm_cluster.cluster.kill_host(2)
    wait_until(None, lambda: f'the job given up or requeued: {tail(out)}',
               lambda: re.search(given_up, out.read_text(), re.M) or requeued(slurm_cluster, job),
               LOST_BOUND, 0.2)
    assert nothing_left(slurm_cluster)
    slurm_cluster.run(['scancel', job])  # it may stay until Slurm takes the node as down


def requeued(slurm, job_id):
    """Whether Slurm has requeued the job (its restart count is above 0)."""
    shown = slurm.run(['scontrol', '-o', 'show', 'job', job_id]).stdout
    return bool(re.search(r'\bRestarts=[1-9]', shown))


MXJOB = REPO / 'examples' / 'kubernetes' / 'mxjob.yaml'


def mxjob_commands(text):
    """``{replica: command}`` of the MXJob manifest: PyYAML's reading where it is installed,
    else the manifest's own simple layout read line by line (flow or block lists)."""
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError:
        yaml = None
    if yaml is not None:
        specs = yaml.safe_load(text)['spec']['mxReplicaSpecs']
        return {k: v['template']['spec']['containers'][0]['command'] for k, v in specs.items()}
    found, replica, block = {}, None, None
    for line in text.splitlines():
        if re.match(r'^    (Scheduler|Server|Worker):$', line):
            replica = line.strip()[:-1]
        elif (m := re.match(r'^\s+command: (\[.*\])$', line)):
            found[replica] = json.loads(m.group(1))
        elif re.match(r'^\s+command:$', line):
            block = found[replica] = []
        elif block is not None and (m := re.match(r'^\s+- (.*)$', line)):
            block.append(json.loads(m.group(1)) if m.group(1).startswith('"') else m.group(1))
        elif block is not None:
            block = None
    return found


def test_the_mxjob_manifest_runs_the_launchers_commands():
    """Not run (no Kubernetes here): its roles run what the launcher runs, and train.py takes
    the worker's arguments."""
    from gluon_multigpu.cli import train  # pylint: disable=import-outside-toplevel
    text = MXJOB.read_text()
    assert re.search(r'^apiVersion: kubeflow\.org/v1$', text, re.M)
    assert re.search(r'^kind: MXJob$', text, re.M)
    commands = mxjob_commands(text)
    assert set(commands) == {'Scheduler', 'Server', 'Worker'}
    assert commands['Scheduler'] == commands['Server'] == ['python', '-c', 'import gluon_multigpu, mxnet']
    worker = commands['Worker']
    assert worker[:2] == ['python', 'scripts/train.py']
    args = train.build_parser().parse_args(worker[2:])
    assert args.kvstore == ['dist_sync'] and args.resume and args.checkpoint_dir

"""The ssh launcher across real hosts: network namespaces on a bridge, an sshd in each.

Each test builds a small cluster (``lab.hosts.cluster``, through
``cluster_fixture``) and runs ``scripts/launch.py --launcher ssh`` on it as a
user would, then checks what the issue asks: the job trains; no process of it
is left on any host however it ends (success, a failure, Ctrl-C, the launcher
killed, a link cut); stopping is ordered, so a stopped run has its checkpoint
and resumes to the uninterrupted result; a lost worker or host is detected
within the stated bound and, with --max-restarts, the job ends equal to an
uninterrupted one. Skipped, with the reason, where no cluster can be made
(not root, no ``ip netns``, no sshd): CI installs sshd so they run there.
"""
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from cluster_fixture import make_cluster  # noqa: F401  (a fixture)
from conftest import REPO, Lines, alive, descendants, run_bounded, wait_bounded
from process_state import Load, cmdline, wait_until
from gluon_multigpu.multihost.plan import TERM_WAIT

LAUNCH, TRAIN = str(REPO / 'scripts' / 'launch.py'), str(REPO / 'scripts' / 'train.py')
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('serial')]  # serial: conftest.SERIAL


def train_args(fashion_dir, ckpt, epochs=2, *extra):
    """A small dist_sync run: 20 steps of 2 x 64 per epoch, a checkpoint every epoch."""
    return [sys.executable, TRAIN, '--kvstore', 'dist_sync', '--cpu-devices', '1',
            '--model', 'simple-cnn', '--batch-size', '64', '--num-train', '2560', '--num-test',
            '500', '--num-epochs', str(epochs), '--data-dir', str(fashion_dir),
            '--progress-interval', '0.3', '--checkpoint-dir', str(ckpt), *extra]


def launcher(cluster, *flags):
    return [sys.executable, LAUNCH, '-n', '2', '-s', '1', '--launcher', 'ssh', '-H',
            cluster.hostfile, *flags, '--']


def final_fingerprint(stdout):
    """The parameter fingerprint of the first worker's last epoch line."""
    found = re.findall(r'rank 0\] epoch \d+/\d+: .*, parameters (\w+)$', stdout, re.M)
    assert found, stdout[-3000:]
    return found[-1]


def job_processes(cluster):
    """``{host: [pid, ...]}`` of the processes on the hosts but sshd's own.

    sshd keeps a session process (``sshd: root@notty``) after the agent it
    ran has ended, until it has told the client so: across a cut link, until
    TCP gives up. It is the ssh server's, not the job's.
    """
    found = {}
    for host, pids in cluster.job_pids().items():
        for pid in pids:
            try:
                with open(f'/proc/{pid}/cmdline', 'rb') as f:
                    if f.read().startswith(b'sshd'):
                        continue
            except OSError:
                continue
            found.setdefault(host, []).append(pid)
    return found


def nothing_left(cluster, timeout):
    """Whether every host has no process but sshd's within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while job_processes(cluster):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def pid_of(cluster, host, pattern):
    """The process on host ``host`` (its index) whose command line matches ``pattern``."""
    for pid in cluster.pids(host):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                line = f.read().replace(b'\0', b' ').decode()
        except OSError:
            continue
        if re.search(pattern, line) and 'gluon_multigpu.multihost.agent' not in line:
            return pid
    raise AssertionError(f'no process matching {pattern!r} on host {host}')


@pytest.fixture(scope='module')
def uninterrupted(fashion_dir, tmp_path_factory):
    """The final fingerprint of the run, uninterrupted, two workers on loopback."""
    out = tmp_path_factory.mktemp('whole')
    proc = run_bounded([sys.executable, LAUNCH, '-n', '2', '-s', '1', '--',
                        *train_args(fashion_dir, out / 'ckpt')], cwd=out, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return final_fingerprint(proc.stdout)


def start(cluster, argv, cwd):
    proc = subprocess.Popen(argv, env=cluster.env(), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, Lines(proc.stdout), Lines(proc.stderr)


def test_a_job_on_three_hosts_trains_labels_every_line_and_leaves_nothing(
        make_cluster, fashion_dir, tmp_path, uninterrupted):
    cluster = make_cluster(3)
    proc = run_bounded(launcher(cluster) + train_args(fashion_dir, tmp_path / 'ckpt'),
                       env=cluster.env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # scheduler on the first host, the server on the second, the workers on the third and first
    hosts = cluster.hosts
    labels = set(re.findall(r'^\[([^\]]+)\]', proc.stdout, re.M))
    assert {f'worker 0@{hosts[2]} as rank 0', f'worker 1@{hosts[0]} as rank 1'} <= labels \
        or {f'worker 0@{hosts[2]} as rank 1', f'worker 1@{hosts[0]} as rank 0'} <= labels, labels
    assert re.search(r'rank 0\] test acc: \d\.\d\d, .* sec/epoch on 2 workers x \[cpu\(0\)\]$',
                     proc.stdout, re.M)
    # over three hosts' own network stacks, the arithmetic of loopback
    assert final_fingerprint(proc.stdout) == uninterrupted
    assert nothing_left(cluster, 5)


def test_ctrl_c_stops_in_order_and_the_resumed_job_equals_the_uninterrupted(
        make_cluster, fashion_dir, tmp_path, uninterrupted):
    cluster = make_cluster(3)
    ckpt = tmp_path / 'ckpt'
    argv = launcher(cluster) + train_args(fashion_dir, ckpt)
    proc, out, err = start(cluster, argv, tmp_path)
    try:
        out.wait_for(r'rank 0\].*epoch 2: \d+/20 batches', timeout=300)  # in the middle of epoch 2
        proc.send_signal(signal.SIGINT)
        assert wait_bounded(proc, 120) == 130
    finally:
        proc.kill()
    said = '\n'.join(err.text())
    assert re.search(r'stopping after step (\d+), as every worker does', '\n'.join(out.text()))
    assert 'launch: stopped by SIGINT: every process has ended' in said
    assert re.search(r'^launch: resume with: .*--resume$', said, re.M), said
    assert 'Traceback' not in said + '\n'.join(out.text())
    assert nothing_left(cluster, 5)
    # the first worker's checkpoint holds the step both stopped after, in epoch 2
    assert re.search(r'rank 0\] interrupted by SIGTERM in epoch 2 after \d+ batch\(es\); '
                     r'checkpoint in ', '\n'.join(out.text())), out.text()[-5:]
    resumed = run_bounded(argv + ['--resume'], env=cluster.env(), cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.search(r'resuming from the checkpoint \d+ batch\(es\) into epoch 2', resumed.stdout)
    assert final_fingerprint(resumed.stdout) == uninterrupted
    assert nothing_left(cluster, 5)


def test_a_worker_killed_on_its_host_restarts_the_job_which_ends_as_the_uninterrupted(
        make_cluster, fashion_dir, tmp_path, uninterrupted):
    cluster = make_cluster(3)
    argv = launcher(cluster, '--max-restarts', '2') + train_args(fashion_dir, tmp_path / 'ck')
    proc, out, err = start(cluster, argv, tmp_path)
    try:
        out.wait_for(r'rank 0\] epoch 1/2: ', timeout=300)  # epoch 1 checkpointed
        out.wait_for(r'rank 0\].*epoch 2: \d+/20 batches', timeout=120)
        victim = pid_of(cluster, 0, r'train\.py')  # worker 1 runs on the first host
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        when, _ = err.wait_for(r'^launch: worker 1@.* failed \(signal SIGKILL\); stopping the '
                               r'job$', timeout=60)
        detected = when - killed
        err.wait_for(r'^launch: restart 1 of 2: starting the job again from its checkpoint',
                     timeout=60)
        assert wait_bounded(proc, 300) == 0, '\n'.join(err.text())
    finally:
        proc.kill()
    load = Load()
    assert detected < load.room(2), (detected, str(load))  # the agent's exit line, at once
    text = '\n'.join(out.text())
    assert re.search(r'resuming from the checkpoint epoch 1', text), text[-3000:]
    assert final_fingerprint(text) == uninterrupted
    assert nothing_left(cluster, 5)


def test_a_host_whose_link_goes_down_is_lost_within_the_timeout_and_left_clean(
        make_cluster, fashion_dir, tmp_path, uninterrupted):
    cluster = make_cluster(3)
    timeout = 5
    argv = launcher(cluster, '--max-restarts', '1', '--timeout', str(timeout)) + \
        train_args(fashion_dir, tmp_path / 'ck')
    proc, out, err = start(cluster, argv, tmp_path)
    try:
        out.wait_for(r'rank 0\] epoch 1/2: ', timeout=300)
        cut = time.monotonic()
        cluster.link_down(2)  # worker 0's host: nobody reaches it, it reaches nobody
        when, _ = err.wait_for(r'^launch: worker 0@.* not heard from .* for 5 s \(host or link '
                               r'down\); stopping the job$', timeout=60)
        detected = when - cut
        # the job goes on without the lost host: both workers now on the first two hosts
        err.wait_for(rf'restart 1 of 1: .* on 2 host\(s\) \({re.escape(cluster.hosts[0])}, '
                     rf'{re.escape(cluster.hosts[1])}\)', timeout=60)
        assert wait_bounded(proc, 300) == 0, '\n'.join(err.text())
        # the cut-off host's agent heard nobody either and ended its worker itself
        assert nothing_left(cluster, timeout + TERM_WAIT + 5)
    finally:
        proc.kill()
        cluster.link_up(2)
    # heartbeats every 2 s, a 5 s timeout counted from the last one heard, which came up to 2 s
    # before the cut: 3 s of room on a quiet machine
    load = Load()
    assert timeout - 2 <= detected < timeout + load.room(3), (detected, str(load))
    assert final_fingerprint('\n'.join(out.text())) == uninterrupted


def test_the_launcher_killed_leaves_no_process_on_any_host(make_cluster, fashion_dir, tmp_path):
    cluster = make_cluster(3)
    proc, out, _ = start(cluster, launcher(cluster) + train_args(fashion_dir, tmp_path / 'ck'),
                         tmp_path)
    try:
        out.wait_for(r'rank 0\].*epoch 1: \d+/20 batches', timeout=300)
        assert len(job_processes(cluster)) == 3  # every host runs part of the job
        proc.kill()  # SIGKILL: no handler runs
        proc.wait()
        # The ssh clients die with the launcher, each agent's input closes, and it ends its
        # process (SIGTERM, then SIGKILL after 3 s).
        assert nothing_left(cluster, 10), job_processes(cluster)
    finally:
        proc.kill()


def test_an_agent_killed_on_its_host_leaves_nothing_of_its_worker(make_cluster, tmp_path):
    cluster = make_cluster(2)
    # a child in the worker's session, and a double-forked daemon in a session of its own
    child, daemon = (f'30{i}.{random.randrange(10**6)}' for i in (3, 4))
    script = f'sleep {child} & (setsid sleep {daemon} &); echo ready; wait'
    proc, out, err = start(cluster, [sys.executable, LAUNCH, '-n', '1', '-s', '1', '--launcher',
                                     'ssh', '-H', cluster.hostfile, '--', '/bin/bash', '-c',
                                     script], tmp_path)
    mine = lambda: [p for pids in cluster.job_pids().values() for p in pids
                    if cmdline(p) in (f'sleep {child} ', f'sleep {daemon} ')]
    try:
        out.wait_for(r'^\[worker 0@.*\] ready$', timeout=120)
        wait_until(proc, 'both sleeps running', lambda: len(mine()) == 2, 30)
        agent, = [p for pids in cluster.job_pids().values() for p in pids
                  if cmdline(p).startswith(f'{sys.executable} -m gluon_multigpu.multihost.agent ')
                  and daemon in cmdline(p) and '--keeper' not in cmdline(p)]
        tree = descendants(agent)  # its keeper, bash, the two sleeps
        os.kill(agent, signal.SIGKILL)  # on the worker's host
        # ssh says that its remote command was killed as it says a broken link: status 255
        err.wait_for(r'^launch: worker 0@(\S+) its connection to \1 ended \(ssh status 255\); '
                     r'stopping the job$', timeout=30)
        assert wait_bounded(proc, 60) == 1
    finally:
        proc.kill()
    left = lambda: mine() + [p for p in tree if alive(p)]
    try:
        wait_until(None, 'every process of the worker ended', lambda: not left(), 10)
    finally:
        for pid in left():
            os.kill(pid, signal.SIGKILL)
    assert nothing_left(cluster, 10), job_processes(cluster)


def test_a_stopped_worker_is_found_and_a_second_ctrl_c_kills_at_once(
        make_cluster, fashion_dir, tmp_path):
    cluster = make_cluster(3)
    argv = launcher(cluster, '--timeout', '4') + train_args(fashion_dir, tmp_path / 'ck')
    proc, out, err = start(cluster, argv, tmp_path)
    try:
        out.wait_for(r'rank 0\].*epoch 1: \d+/20 batches', timeout=300)
        stopped = time.monotonic()
        os.kill(pid_of(cluster, 2, r'train\.py'), signal.SIGSTOP)
        when, _ = err.wait_for(r'^launch: worker 0@.* stopped \(SIGSTOP\) for 4 s; stopping the '
                               r'job$', timeout=30)
        load = Load()
        # the timeout, a heartbeat, room (3 s on a quiet machine)
        assert 4 <= when - stopped < 4 + 2 + load.room(3), (when - stopped, str(load))
        assert wait_bounded(proc, 30) == 1
    finally:
        proc.kill()
    assert nothing_left(cluster, 5)
    # Ctrl-C, then Ctrl-C again while the workers finish their step: every process at once
    proc, out, err = start(cluster, argv, tmp_path)
    try:
        out.wait_for(r'rank 0\].*epoch 1: \d+/20 batches', timeout=300)
        os.kill(pid_of(cluster, 2, r'train\.py'), signal.SIGSTOP)  # so the step never ends
        proc.send_signal(signal.SIGINT)
        err.wait_for(r'^launch: SIGINT: stopping the job', timeout=10)
        proc.send_signal(signal.SIGINT)
        assert wait_bounded(proc, 15) == 130
    finally:
        proc.kill()
    said = '\n'.join(err.text())
    assert 'SIGINT again: killing every process now' in said and 'Traceback' not in said, said
    assert nothing_left(cluster, 5)


def test_bad_hosts_and_commands_stop_before_anything_starts(make_cluster, tmp_path):
    cluster = make_cluster(2)
    env = cluster.env()

    def launch(*argv, hosts=None):
        hostfile = tmp_path / 'hosts'
        hostfile.write_text('\n'.join(hosts or cluster.hosts) + '\n')
        return run_bounded([sys.executable, LAUNCH, '-n', '2', '--launcher', 'ssh', '-H',
                            str(hostfile), *argv], env=env, cwd=REPO, timeout=120)
    # a host file line that ssh would take for an option
    proc = launch('--', sys.executable, TRAIN, hosts=[cluster.hosts[0], '-V'])
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1
    assert "line 2: '-V' is not a host name" in proc.stderr
    # a program that is not on the hosts
    proc = launch('--', '/no/such/program')
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
    assert 'the command /no/such/program is not a program on this host' in proc.stderr
    # a host that cannot be reached
    cluster.link_down(1)
    try:
        started = time.monotonic()
        proc = launch('--', sys.executable, TRAIN)
        # Timing is the feature (an unreachable host is refused before anything starts, not
        # after ssh's default of minutes): the check's ssh gives up after its 5 s ConnectTimeout;
        # the 35 s beyond are room for the other host's check, scaled by the load measured.
        took, load = time.monotonic() - started, Load()
        assert took < 5 + load.room(35), (took, str(load))
    finally:
        cluster.link_up(1)
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
    assert proc.stderr.startswith(f'error: host {cluster.hosts[1]}: '), proc.stderr
    # workers that never join the parameter server
    proc = launch('--', '/bin/true')
    assert proc.returncode == 1 and 'never joined the parameter server' in proc.stderr
    assert 'Traceback' not in proc.stderr
    assert nothing_left(cluster, 5)


def test_ssh_port_and_identity_flags_reach_hosts_the_configuration_does_not(
        make_cluster, fashion_dir, tmp_path):
    cluster = make_cluster(3, ssh_port=2222)
    # the cluster's ssh configuration without its port and key: ssh alone cannot log in
    config = tmp_path / 'ssh_config'
    config.write_text(''.join(line for line in open(cluster.ssh_config)
                              if not re.match(r'\s*(Port|IdentityFile)\b', line)))
    base = [sys.executable, LAUNCH, '-n', '2', '-s', '1', '--launcher', 'ssh', '-H',
            cluster.hostfile, '--ssh-config', str(config)]
    command = ['--', *train_args(fashion_dir, tmp_path / 'ck', 1)]
    env = dict(os.environ)  # plain ssh, no wrapper
    proc = run_bounded(base + command, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith('error: host '), proc.stderr
    proc = run_bounded(base + ['--ssh-port', '2222', '--ssh-identity', cluster.identity] +
                       command, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.search(r'rank 0\] test acc: ', proc.stdout)
    assert nothing_left(cluster, 5)

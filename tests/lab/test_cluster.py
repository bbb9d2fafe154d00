"""The small cluster on one machine: namespaces on a bridge, each with its own sshd.

Real ones: every test makes clusters (a third of a second each), reaches
their hosts over ssh and TCP, cuts and shapes their links, kills hosts, and
checks that closing (or the next cluster, after a SIGKILLed creator) leaves
nothing behind. Skipped where no cluster can be made (not root, no
``ip netns``, no sshd).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cluster_fixture import make_cluster, make_module_cluster  # noqa: F401  (fixtures)
from conftest import REPO, alive, wait_bounded
from process_state import Load
from lab.hosts import cluster as gc
from lab.hosts import netns
from lab.hosts import sshd

AVAILABLE = gc.available()
pytestmark = [pytest.mark.skipif(not AVAILABLE[0], reason=f'no cluster here: {AVAILABLE[1]}'), pytest.mark.xdist_group('serial')]

# A TCP server on one host: answers each of `count` connections with its own address and the
# peer's, then ends.
ECHO_SERVER = r'''
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5000))
s.listen(16)
print('ready', flush=True)
for _ in range(int(sys.argv[2])):
    c, peer = s.accept()
    c.sendall(f'{sys.argv[1]} {peer[0]}\n'.encode())
    c.close()
'''
# Connects to each address given; prints what each answered.
ECHO_CLIENT = r'''
import socket, sys
for host in sys.argv[1:]:
    with socket.create_connection((host, 5000), timeout=5) as c:
        print(c.makefile().readline().strip(), flush=True)
'''
# Receives one connection's bytes; prints how many and the seconds from the first to the end.
SINK = r'''
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5001))
s.listen(1)
print('ready', flush=True)
c, _ = s.accept()
n, first = 0, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    first = first or time.monotonic()
    n += len(b)
print(n, time.monotonic() - first, flush=True)
'''
SOURCE = r'''
import socket, sys
c = socket.create_connection((sys.argv[1], 5001), timeout=10)
buf = b'x' * (1 << 20)
for _ in range(int(sys.argv[2])):
    c.sendall(buf)
c.close()
'''
# Tries to connect; prints 'connected' or the error.
PROBE = r'''
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print('connected')
except OSError as e:
    print(type(e).__name__, e)
'''


def netns_names():
    return set(os.listdir('/run/netns')) if os.path.isdir('/run/netns') else set()


def link_names():
    return set(netns.link_names())


def rules():
    return subprocess.run(['ip', 'rule'], capture_output=True, text=True, check=True).stdout


def cmdline(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().replace(b'\0', b' ').decode().strip()
    except OSError:
        return ''


def all_pids(namespace):
    """Every process in ``namespace``, the sshd listener included."""
    return netns.namespace_pids([namespace]).get(namespace, [])


def wait_until(predicate, timeout=5.0, what='the condition'):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f'{what} did not hold within {timeout} s'
        time.sleep(0.02)


def transfer_rate(cluster, megabytes, src=0, dst=1):
    """MB/s of one TCP connection from host ``src`` to host ``dst`` carrying ``megabytes`` MiB."""
    sink = cluster.popen_in(dst, [sys.executable, '-c', SINK, cluster.hosts[dst]],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == 'ready'
        sent = cluster.run_in(src, [sys.executable, '-c', SOURCE, cluster.hosts[dst], str(megabytes)],
                              timeout=60)
        assert sent.returncode == 0, sent.stderr
        count, seconds = sink.stdout.readline().split()
        assert int(count) == megabytes << 20
        return int(count) / float(seconds) / 1e6
    finally:
        sink.kill()
        wait_bounded(sink, 10)


@pytest.fixture(scope='module')
def three(make_module_cluster):
    """One three-host cluster for the tests that only look."""
    return make_module_cluster(3)


def test_rate_bytes():
    assert gc.rate_bytes('100mbit') == 12.5e6
    assert gc.rate_bytes('1gbit') == gc.rate_bytes('1GBit') == 125e6
    assert gc.rate_bytes('10mbps') == 10e6
    assert gc.rate_bytes('1mibit') == 1024 ** 2 / 8
    assert gc.rate_bytes('8000') == 1000
    assert gc.rate_bytes(' 2.5mbit ') == 312500
    for bad in ('fast', '10%', '-1mbit', '0gbit', '1 gbit', '1gigabit', '', None):
        with pytest.raises(ValueError, match='not a tc rate'):
            gc.rate_bytes(bad)


def test_bad_arguments_make_nothing(monkeypatch):
    def touched():
        raise AssertionError('a cluster with bad arguments got past their checks')
    monkeypatch.setattr(gc, 'available', touched)  # the first step after them
    for kw in ({'num_hosts': 0}, {'num_hosts': 300}, {'bandwidth': 'fast'}, {'ssh_port': 0}):
        with pytest.raises(ValueError):
            gc.Cluster(**kw)


def test_files_and_addresses(three):
    k = three.hosts[0].split('.')[2]
    assert three.subnet == f'198.18.{k}.0/24' and three.gateway == f'198.18.{k}.1'
    assert three.hosts == [f'198.18.{k}.{i}' for i in (2, 3, 4)]
    with open(three.hostfile) as f:
        assert f.read().split('\n') == three.hosts + ['']
    assert all(len(n) <= 15 for n in three.namespaces + three.veths + [three.bridge])
    assert set(three.namespaces) <= netns_names()
    assert {three.bridge, *three.veths} <= link_names()
    with open(three.ssh_config) as f:
        config = f.read()
    for line in ('User root', f'IdentityFile {three.identity}', 'IdentitiesOnly yes', 'Port 22',
                 'StrictHostKeyChecking yes', 'BatchMode yes', 'LogLevel ERROR', 'ConnectTimeout 5'):
        assert line in config
    wrapper = os.path.join(three.bin_dir, 'ssh')
    assert os.access(wrapper, os.X_OK) and three.ssh_config in open(wrapper).read()
    # the rule that keeps the bridge's packets on this machine
    assert f'iif {three.bridge} unreachable' in rules()


def test_ssh_reaches_every_host(three):
    for i, host in enumerate(three.hosts):
        done = three.ssh(i, 'echo $SSH_CONNECTION; echo $USER', timeout=20)
        assert done.returncode == 0, done.stderr
        client, _, server, port = done.stdout.split('\n')[0].split()
        assert (client, server, port) == (three.gateway, host, '22')
        assert done.stdout.split('\n')[1] == 'root'


def test_hosts_reach_each_other_over_tcp(three):
    n = len(three.hosts)
    servers = [three.popen_in(i, [sys.executable, '-c', ECHO_SERVER, host, str(n - 1)],
                              stdout=subprocess.PIPE, text=True)
               for i, host in enumerate(three.hosts)]
    try:
        for server in servers:
            assert server.stdout.readline().strip() == 'ready'
        for i in range(n):
            others = [h for j, h in enumerate(three.hosts) if j != i]
            done = three.run_in(i, [sys.executable, '-c', ECHO_CLIENT, *others], timeout=30)
            assert done.returncode == 0, done.stderr
            # each answered from its own address, and saw host i's address as the peer
            assert done.stdout.split('\n')[:-1] == [f'{h} {three.hosts[i]}' for h in others]
        for server in servers:
            assert wait_bounded(server, 10) == 0
    finally:
        for server in servers:
            server.kill()
            server.wait()


def test_env_makes_plain_ssh_reach_the_hosts(three):
    env = three.env({'PATH': '/usr/bin:/bin', 'OTHER': 'kept'})
    assert env['PATH'] == f'{three.bin_dir}:/usr/bin:/bin' and env['OTHER'] == 'kept'
    assert shutil.which('ssh', path=env['PATH']) == os.path.join(three.bin_dir, 'ssh')
    assert three.env()['PATH'].startswith(three.bin_dir + os.pathsep)
    for host in three.hosts:
        done = subprocess.run(['ssh', host, 'true'], env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=20)
        assert done.returncode == 0, done.stderr


def test_other_ssh_port(make_cluster):
    cluster = make_cluster(1, ssh_port=2222)
    done = subprocess.run(['ssh', cluster.hosts[0], 'echo $SSH_CONNECTION'], env=cluster.env(),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[2:] == [cluster.hosts[0], '2222']


def test_pids_see_jobs_but_not_sshd(make_cluster):
    cluster = make_cluster(2)
    assert cluster.pids(0) == [] and cluster.job_pids() == {}
    listener, = all_pids(cluster.namespaces[0])
    assert '[listener]' in cmdline(listener)
    done = cluster.ssh(0, 'nohup /bin/sleep 30 >/dev/null 2>&1 &', timeout=20)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: [cmdline(p) for p in cluster.pids(0)] == ['/bin/sleep 30'], what='only the sleep')
    sleep, = cluster.pids(0)
    assert listener not in cluster.pids(0) and listener in all_pids(cluster.namespaces[0])
    assert cluster.job_pids() == {0: [sleep]}
    # and processes started directly in a namespace
    proc = cluster.popen_in(1, ['/bin/sleep', '30'])
    wait_until(lambda: cluster.job_pids() == {0: [sleep], 1: [proc.pid]}, what='both jobs seen')
    proc.kill()
    wait_bounded(proc, 10)
    assert cluster.job_pids() == {0: [sleep]}


def test_run_in_runs_in_the_namespace(three):
    done = three.run_in(1, [sys.executable, '-c', 'import socket; s = socket.socket(); '
                            f's.bind(("{three.hosts[1]}", 0)); print("bound")'], timeout=20)
    assert done.returncode == 0 and done.stdout == 'bound\n', done.stderr
    # host 1's address is not this namespace's
    done = subprocess.run([sys.executable, '-c', 'import socket; s = socket.socket(); '
                           f's.bind(("{three.hosts[1]}", 0))'], capture_output=True, timeout=20)
    assert done.returncode != 0
    with pytest.raises(TypeError):
        three.run_in(0, 'true')
    with pytest.raises(IndexError):
        three.ssh(3, 'true')


def test_link_down_and_up(make_cluster):
    cluster = make_cluster(2)
    assert cluster.ssh(1, 'true', timeout=20).returncode == 0
    cluster.link_down(1)
    # plain ssh gives up after its ConnectTimeout (5 s in ssh_config; 2 s here, for time)
    start = time.monotonic()
    done = subprocess.run(['ssh', '-o', 'ConnectTimeout=2', cluster.hosts[1], 'true'], env=cluster.env(),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    took = time.monotonic() - start
    load = Load()
    # Timing is the feature (a link down is a host ssh gives up on): the 2 s beyond the
    # ConnectTimeout are room for ssh's start (0.1 s on a quiet machine), scaled by the load.
    assert done.returncode == 255 and took < 2 + load.room(2), (done, took, str(load))
    # host 0 still answers, host 1 cannot reach it either
    assert cluster.ssh(0, 'true', timeout=20).returncode == 0
    probe = cluster.run_in(1, [sys.executable, '-c', PROBE, cluster.hosts[0], '22', '1'], timeout=20)
    assert probe.stdout.strip() != 'connected'
    cluster.link_up(1)
    done = cluster.ssh(1, 'true', timeout=20)
    assert done.returncode == 0, done.stderr


def test_kill_host(make_cluster):
    cluster = make_cluster(3)
    assert cluster.ssh(1, 'nohup /bin/sleep 30 >/dev/null 2>&1 &', timeout=20).returncode == 0
    session = subprocess.Popen(['ssh', cluster.hosts[1], '/bin/sleep 30'], env=cluster.env(),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: [cmdline(p) for p in cluster.pids(1)].count('/bin/sleep 30') == 2, what='both sleeps')
    cluster.kill_host(1)
    assert all_pids(cluster.namespaces[1]) == []  # sshd too
    assert 1 not in cluster.job_pids()
    # the session ends (its connection was closed before the link went down)
    assert wait_bounded(session, 10) == 255
    probe = cluster.run_in(0, [sys.executable, '-c', PROBE, cluster.hosts[1], '22', '0.5'], timeout=20)
    assert probe.stdout.strip() != 'connected'
    for i in (0, 2):
        assert cluster.ssh(i, 'true', timeout=20).returncode == 0


def test_shaping_limits_both_directions(make_cluster):
    cluster = make_cluster(2, bandwidth='100mbit')
    for i in range(2):
        for prefix, dev in ((['tc', '-n', cluster.namespaces[i]], 'eth0'), (['tc'], cluster.veths[i])):
            shown = subprocess.run(prefix + ['qdisc', 'show', 'dev', dev], capture_output=True, text=True).stdout
            assert 'tbf' in shown and 'rate 100Mbit' in shown, shown
    limit = 12.5  # MB/s
    for src, dst in ((0, 1), (1, 0)):
        rate = transfer_rate(cluster, 4, src, dst)
        assert 0.3 * limit < rate < 1.15 * limit, rate
    cluster.unshape(0)
    cluster.unshape(1)
    assert transfer_rate(cluster, 32) > 3 * limit
    # shaping one host limits the connections it takes part in
    cluster.shape(1, '100mbit')
    assert transfer_rate(cluster, 4) < 1.15 * limit


def test_two_clusters_at_once(make_cluster):
    a, b = make_cluster(1), make_cluster(1)
    assert a.subnet != b.subnet and a.name != b.name
    assert not set(a.namespaces + a.veths) & set(b.namespaces + b.veths)
    for c in (a, b):
        assert c.ssh(0, 'true', timeout=20).returncode == 0
    # no route from one to the other: the root namespace does not forward
    probe = a.run_in(0, [sys.executable, '-c', PROBE, b.hosts[0], '22', '0.5'], timeout=20)
    assert probe.stdout.strip() != 'connected'


def test_close_leaves_nothing():
    with pytest.raises(RuntimeError, match='the block failed'):
        with gc.Cluster(2, bandwidth='1gbit') as cluster:
            assert cluster.ssh(0, 'nohup /bin/sleep 30 >/dev/null 2>&1 &', timeout=20).returncode == 0
            proc = cluster.popen_in(1, ['/bin/sleep', '30'])
            wait_until(lambda: len(cluster.job_pids()) == 2, what='the jobs on both hosts')
            pids = [p for i in range(2) for p in all_pids(cluster.namespaces[i])]
            assert len(pids) >= 4  # two listeners, two sleeps
            raise RuntimeError('the block failed')
    assert proc.returncode is not None  # killed and collected
    for pid in pids:
        assert not alive(pid), cmdline(pid)
    assert not set(cluster.namespaces) & netns_names()
    assert not {cluster.bridge, *cluster.veths} & link_names()
    assert f'iif {cluster.bridge} ' not in rules()
    assert not os.path.exists(cluster.workdir)
    assert not os.path.exists(os.path.join(gc.REGISTRY, f'{cluster.name}.json'))
    assert cluster.hosts[0] not in subprocess.run(['ip', '-4', 'addr'], capture_output=True, text=True).stdout
    cluster.close()  # again: nothing to do
    with pytest.raises(gc.ClusterError, match='closed'):
        cluster.ssh(0, 'true')


def test_given_workdir_is_kept(make_cluster, tmp_path):
    cluster = make_cluster(1, workdir=str(tmp_path / 'w'))
    assert cluster.ssh(0, 'true', timeout=20).returncode == 0
    cluster.close()
    assert os.path.isfile(tmp_path / 'w' / 'sshd-0.log')


def test_failed_setup_undoes_itself(monkeypatch):
    started = []

    def start_sshds(self):
        started.append(self)
        return start(self)
    start = gc.Cluster._start_sshds
    monkeypatch.setattr(gc.Cluster, '_start_sshds', start_sshds)
    monkeypatch.setattr(sshd, 'SSHD', '/bin/false')
    with pytest.raises(gc.ClusterError) as failed:
        gc.Cluster(2)
    message = str(failed.value)
    assert '\n' not in message and 'ended with status 1' in message, message
    cluster, = started  # got as far as the network
    assert not set(cluster.namespaces) & netns_names()
    assert not {cluster.bridge, *cluster.veths} & link_names()
    assert f'iif {cluster.bridge} ' not in rules()
    assert not os.path.exists(cluster.workdir)
    assert not os.path.exists(os.path.join(gc.REGISTRY, f'{cluster.name}.json'))


def test_cluster_of_a_killed_process_is_removed_by_the_next(make_cluster):
    code = ('import json, time\n'
            'from lab.hosts.cluster import Cluster\n'
            'c = Cluster(2)\n'
            'assert c.ssh(0, "nohup /bin/sleep 60 >/dev/null 2>&1 &").returncode == 0\n'
            'print(json.dumps(dict(name=c.name, namespaces=c.namespaces, veths=c.veths, bridge=c.bridge,'
            ' workdir=c.workdir)), flush=True)\n'
            'time.sleep(60)\n')
    creator = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        made = json.loads(creator.stdout.readline())
    finally:
        creator.send_signal(signal.SIGKILL)
        wait_bounded(creator, 10)
    def left_behind():
        return [p for ns in made['namespaces'] for p in all_pids(ns)]
    # the two listeners and the sleep outlived their creator (ssh returns once the command is forked
    # into the background: the sleep may still be the shell or nohup for a moment)
    wait_until(lambda: '/bin/sleep 60' in map(cmdline, left_behind()), what='the sleep to start')
    left = left_behind()
    assert sum('[listener]' in cmdline(p) for p in left) == 2 and '/bin/sleep 60' in map(cmdline, left)
    assert set(made['namespaces']) <= netns_names() and os.path.isdir(made['workdir'])
    make_cluster(1)
    for pid in left:
        assert not alive(pid), cmdline(pid)
    assert not set(made['namespaces']) & netns_names()
    assert not {made['bridge'], *made['veths']} & link_names()
    assert f'iif {made["bridge"]} ' not in rules()
    assert not os.path.exists(made['workdir'])
    assert not os.path.exists(os.path.join(gc.REGISTRY, f'{made["name"]}.json'))

"""Training on MXNet's parameter server on loopback: equal to one process, supervised, bounded."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import mxnet as mx
import numpy as onp
import pytest

import gluon_multigpu as gm
from lab.studies import scaling_model as lab_scaling
from conftest import (REPO, Lines, alive, assert_one_step_close, children, descendants,
                      load_script,
                      run_bounded, simple_cnn_terms, wait_bounded)
from gluon_multigpu.multihost.plan import TERM_WAIT
from process_state import Load

LAUNCH, TRAIN = str(REPO / 'scripts' / 'launch.py'), str(REPO / 'scripts' / 'train.py')


def train_args(fashion_dir, *extra):
    return ['--model', 'simple-cnn', '--num-train', '1280', '--num-test', '500', '--lr', '0.3',
            '--num-epochs', '2', '--data-dir', str(fashion_dir), '--progress-interval', '0',
            *map(str, extra)]


def launch(workers, *command, timeout=300, **kw):
    return run_bounded([sys.executable, LAUNCH, '-n', str(workers), '-s', '1', '--',
                        sys.executable, *command], timeout=timeout, **kw)


def saved_params(ckpt):
    manifest = json.loads((ckpt / 'manifest.json').read_text())
    return {k.split('_', 1)[-1]: v.asnumpy()
            for k, v in mx.npx.load(str(ckpt / manifest['files']['params']['name'])).items()}


#: One global batch of 128 samples, one epoch: one step. Equality to one process is claimed
#: for one step, where the difference is rounding (conftest.one_step_bound); over many steps
#: rounding differences grow (a ReLU flips on one) and no bound of the arithmetic holds.
ONE_STEP = ('--num-train', '128', '--num-epochs', '1')


@pytest.fixture(scope='module')
def one_process(fashion_dir, tmp_path_factory):
    """One process on two CPU contexts, one step of 128: what two workers of 64 each must equal."""
    out = tmp_path_factory.mktemp('single')
    proc = run_bounded([sys.executable, TRAIN, '--cpu-devices', '2', '--batch-size', '128',
                        *train_args(fashion_dir, *ONE_STEP, '--checkpoint-dir', out / 'ckpt',
                                    '--json', out / 'run.json')])
    assert proc.returncode == 0, proc.stderr
    return out


def initial_params(seed=0):
    """The parameters train.py starts from with ``--seed`` ``seed``, by name (as saved)."""
    mx.random.seed(seed)
    net = gm.simple_cnn()
    net.initialize(gm.default_initializer('simple-cnn'), ctx=mx.cpu())
    net(mx.np.zeros((1, 1, 28, 28)))  # deferred initialisation: the shapes wait for an input
    return {k: p.data().asnumpy() for k, p in net._collect_params_with_prefix().items()}


def worker_hashes(stdout):
    """(epoch, parameter hash) of every epoch line of every worker."""
    return re.findall(r'^\[worker \d@127\.0\.0\.1 as rank \d\] (?:rank 1: )?epoch (\d)/\d: .*, '
                      r'parameters (\w+)$',
                      stdout, re.M)


@pytest.mark.slow
@pytest.mark.parametrize('kvstore', ['dist_sync', 'dist_device_sync'])
def test_two_workers_equal_one_process_on_their_devices(one_process, fashion_dir, tmp_path,
                                                        kvstore):
    ckpt = tmp_path / 'ckpt'

    def run(*extra):
        proc = launch(2, TRAIN, '--kvstore', kvstore, '--cpu-devices', '1', '--batch-size', '64',
                      *train_args(fashion_dir, *ONE_STEP, '--checkpoint-dir', ckpt, '--json',
                                  tmp_path / 'run.json', *extra), cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:]
        return proc.stdout
    first = run()
    final = [l for l in first.splitlines() if 'test acc: ' in l and 'sec/epoch' in l]
    assert len(final) == 1 and final[0].endswith('on 2 workers x [cpu(0)]')
    # equal to one process on two contexts that saw the same global batch
    single = json.loads((one_process / 'run.json').read_text())['runs'][0]['epochs']
    dist = json.loads((tmp_path / 'run.json').read_text())['runs'][0]['epochs']
    assert [e['test_acc'] for e in dist] == pytest.approx([e['test_acc'] for e in single],
                                                          abs=2 / 500)
    a, b, before = saved_params(ckpt), saved_params(one_process / 'ckpt'), initial_params()
    assert sorted(a) == sorted(b) == sorted(before)
    names = list(before)  # the network's order
    # (``before`` is where both started: a step moves each weight by a fraction of its size)
    assert all(onp.abs(b[k] - before[k]).max() < 0.1 * onp.abs(before[k]).max()
               for k in names if k.endswith('weight'))
    assert_one_step_close([before[k] for k in names], [b[k] for k in names],
                          [a[k] for k in names], simple_cnn_terms(128), names)
    # every epoch, both workers hold bit-identical parameters (a second epoch, resumed)
    second = run('--num-epochs', '2', '--resume')
    prints = worker_hashes(first) + worker_hashes(second)
    assert sorted(e for e, _ in prints) == ['1', '1', '2', '2'], prints  # two workers, 2 epochs
    for epoch in ('1', '2'):
        assert len({p for e, p in prints if e == epoch}) == 1, prints


@pytest.mark.slow
def test_asynchronous_workers_learn(fashion_dir, tmp_path):
    # (later flags win: 200 steps for each worker, at a rate that stale gradients tolerate)
    proc = launch(2, TRAIN, '--kvstore', 'dist_async', '--cpu-devices', '1', '--batch-size', '64',
                  *train_args(fashion_dir, '--json', tmp_path / 'run.json', '--num-train', 12800,
                              '--num-epochs', 2, '--lr', 0.1), cwd=tmp_path,
                  timeout=600)  # 263 s seen on two cores shared with two CPU-bound jobs
    assert proc.returncode == 0, proc.stdout[-2000:]
    acc = json.loads((tmp_path / 'run.json').read_text())['runs'][0]['epochs'][-1]['test_acc']
    assert acc > 0.5  # one class for all scores about 0.1


def gone(pids, timeout=30):
    """Whether every process of ``pids`` has ended (or is a zombie) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while [p for p in pids if alive(p)]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
@pytest.mark.xdist_group('timing')  # conftest.TIMING: times the stop
def test_a_killed_worker_stops_everything_within_the_bound(fashion_dir, tmp_path):
    # The workers' grace (the time they get to finish a step when the job is stopped by a
    # signal) far beyond the bound and the deadline below: a stop on a failure that waited
    # for it would fail here at any load, while the bound itself gets room for the load.
    proc = subprocess.Popen([sys.executable, LAUNCH, '-n', '2', '-s', '1', '--grace', '900', '--',
                             sys.executable, TRAIN, '--kvstore', 'dist_sync', '--cpu-devices', '1',
                             *train_args(fashion_dir)[:-6], '--num-epochs', '50',
                             '--data-dir', str(fashion_dir), '--progress-interval', '1'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        Lines(proc.stdout).wait_for(r'epoch (1/50: |\d+: \d+/\d+ batches)', timeout=300)  # they train
        agents = children(proc.pid)
        assert len(agents) == 4  # scheduler, server, two workers, each under its agent
        everything = descendants(proc.pid)
        assert len(everything) == 12  # and under each agent its keeper, and under that its process
        keeper, = children(agents[-1])
        worker, = children(keeper)
        killed = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        status = wait_bounded(proc, 300)
        took = time.monotonic() - killed
    finally:
        proc.kill()
    load = Load()
    err = proc.stderr.read()
    assert status == 1 and re.search(r'^launch: worker 1@127\.0\.0\.1 as rank \d failed \(signal '
                                     r'SIGKILL\); stopping the job$', err, re.M), err
    assert gone(everything)
    # The other worker waits forever for the dead one's gradients: SIGKILL 3 s after SIGTERM
    # (launch.TERM_WAIT) ends it; the servers end at SIGTERM. Then the launcher's polling
    # (every 0.1 s), the processes' exits and the launcher's own: 3 s of room on a quiet
    # machine, scaled by the load measured (3 s alone broke at a load average of 13 to 23 on
    # 2 cores).
    assert took < TERM_WAIT + load.room(3), (
        f'the job ended {took:.1f} s after the kill, more than {TERM_WAIT:.0f} s + '
        f'{load.room(3):.1f} s; {load}')


@pytest.mark.parametrize('argv, message', [
    (['-n', '0', '--', 'true'], '-n/--num-workers: 0 is not positive'),
    (['-n', '2', '--launcher', 'ssh', '-H', '/no/such/hosts', '--', 'true'],
     '--hostfile /no/such/hosts: No such file or directory'),
    (['-n', '2', '--launcher', 'ssh', '-H', 'EMPTY', '--', 'true'], 'lists no host'),
    (['-n', '2', '--launcher', 'ssh', '--', 'true'], '--launcher ssh needs --hostfile'),
    (['-n', '2'], 'no command to run'),
    (['-n', '2', '--port', 'BUSY', '--', 'true'], 'is in use'),
])
def test_bad_launcher_input_is_one_line_and_status_2(argv, message, tmp_path, capsys):
    empty = tmp_path / 'hosts'
    empty.write_text('# nobody\n\n')
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        argv = [str(empty) if a == 'EMPTY' else str(busy.getsockname()[1]) if a == 'BUSY' else a
                for a in argv]
        try:
            status = load_script('launch').main(argv)
        except SystemExit as e:
            status = e.code
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and message in err, err


def test_a_dist_kvstore_without_the_launcher_is_one_line(fashion_dir, capsys, monkeypatch):
    for name in ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT', 'DMLC_NUM_SERVER',
                 'DMLC_NUM_WORKER'):
        monkeypatch.delenv(name, raising=False)
    status = load_script('train').main(['--kvstore', 'dist_sync', '--cpu-devices', '1',
                                        '--data-dir', str(fashion_dir)])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1
    assert 'DMLC_ROLE, DMLC_PS_ROOT_URI' in err and 'scripts/launch.py -n WORKERS' in err


def test_a_worker_shard_is_its_part_of_each_global_batch():
    n, batch, workers = 103, 4, 3
    images = onp.arange(n * 4, dtype=onp.uint8).reshape(n, 2, 2)
    labels = onp.arange(n, dtype=onp.int32)
    whole = gm.ArrayLoader(images, labels, batch * workers, shuffle=True, seed=5,
                           last_batch='discard')
    shards = [gm.distributed.WorkerShard(images, labels, batch, r, workers, seed=5)
              for r in range(workers)]
    for _ in range(2):  # two epochs, two orders
        steps = [list(s) for s in shards]
        assert {len(s) for s in steps} == {n // (batch * workers)}  # equal steps: nobody waits
        for i, (X, y) in enumerate(whole):
            joined = onp.concatenate([steps[r][i][1].asnumpy() for r in range(workers)])
            onp.testing.assert_array_equal(joined, y.asnumpy())
    seen = onp.concatenate([b[1].asnumpy() for s in shards for b in s])
    assert len(set(seen.tolist())) == len(seen)  # no sample twice in an epoch


def test_the_worker_projection_follows_its_formula():
    rows = lab_scaling.worker_projection(0.05, 40e6, [1, 2, 4, 8], servers=2, gbps=1.0)
    for r in rows:  # recomputed by hand: push, then pull, of 40 MB as one key, 2 servers
        t_net = 2 * 40e6 * max(1, r['workers'] / 2) / 1e9
        assert r['t_net_s'] == pytest.approx(t_net)
        assert r['speedup'] == pytest.approx(r['workers'] * 0.05 / (0.05 + t_net))
        assert r['efficiency'] == pytest.approx(r['speedup'] / r['workers'])
    assert rows[2]['t_net_s'] == rows[1]['t_net_s'] * 2  # past the servers, links fill up
    # many keys: the pulls overlap the pushes but for the largest key (10 MB of the 40)
    keyed = lab_scaling.worker_projection(0.05, 40e6, [1, 2, 4, 8], servers=2, gbps=1.0,
                                         largest_bytes=10e6)
    for r, one_key in zip(keyed, rows):
        t_net = (40e6 + 10e6) * max(1, r['workers'] / 2) / 1e9
        assert r['t_net_s'] == pytest.approx(t_net) == one_key['t_net_s'] * 50 / 80
        assert r['t_step_s'] == pytest.approx(0.05 + t_net)
        assert r['speedup'] == pytest.approx(r['workers'] * 0.05 / (0.05 + t_net))
        assert r['efficiency'] == pytest.approx(r['speedup'] / r['workers'])


@pytest.mark.slow
def test_a_parameter_server_run_resumes_with_the_same_workers(fashion_dir, tmp_path):
    def run(ckpt, epochs, *extra):
        proc = launch(2, TRAIN, '--kvstore', 'dist_sync', '--cpu-devices', '1', '--batch-size',
                      '64', *train_args(fashion_dir, '--checkpoint-dir', ckpt, *extra,
                                        '--num-epochs', epochs), cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:]
        return proc.stdout
    run(tmp_path / 'whole', 2)
    run(tmp_path / 'parts', 1)
    resumed = run(tmp_path / 'parts', 2, '--resume')
    assert 'resuming from the checkpoint epoch 1' in resumed
    a, b = saved_params(tmp_path / 'whole'), saved_params(tmp_path / 'parts')
    for k in a:
        onp.testing.assert_array_equal(a[k], b[k], err_msg=k)  # the servers' arithmetic is exact


def watch_children(proc, lines, pattern=None, timeout=300):
    """The processes below ``proc`` seen until a line of ``lines`` matches ``pattern`` (None:
    until ``proc`` ends), within ``timeout`` s: ``(job, every)``, ``job`` the launcher's
    agents, their keepers and the processes those started, ``every`` all of them and anything
    those started (importing MXNet runs NumPy's ``lscpu`` for a moment, for one)."""
    job, every, deadline = set(), set(), time.monotonic() + timeout
    while True:
        agents = children(proc.pid)
        keepers = {p for a in agents for p in children(a)}
        job |= set(agents) | keepers | {p for k in keepers for p in children(k)}
        every |= job | set(descendants(proc.pid))
        if pattern is None and proc.poll() is not None:
            return job, every
        if pattern is not None and any(re.search(pattern, l) for l in lines.text()):
            return job, every
        assert time.monotonic() < deadline, f'no line {pattern!r} within {timeout} s'
        time.sleep(0.05)


@pytest.mark.slow
def test_ctrl_c_stops_every_process_and_a_finished_run_leaves_none(fashion_dir, tmp_path):
    command = [sys.executable, LAUNCH, '-n', '2', '-s', '1', '--', sys.executable, TRAIN,
               '--kvstore', 'dist_sync', '--cpu-devices', '1', '--model', 'simple-cnn',
               '--num-train', '1280', '--num-test', '100', '--data-dir', str(fashion_dir),
               '--progress-interval', '0.5']
    # Ctrl-C in the middle of training
    proc = subprocess.Popen(command + ['--num-epochs', '50'], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        job, seen = watch_children(proc, Lines(proc.stdout), r'epoch (1/50: |\d+: \d+/\d+ batches)')
        proc.send_signal(signal.SIGINT)
        assert wait_bounded(proc, 60) == 130
    finally:
        proc.kill()
    assert 'launch: stopped by SIGINT: every process has ended' in proc.stderr.read()
    assert len(job) == 12 and gone(seen)  # 4 agents, their 4 keepers, the keepers' 4 processes
    # a run to its end
    proc = subprocess.Popen(command + ['--num-epochs', '1'], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        job, seen = watch_children(proc, Lines(proc.stdout))
        assert wait_bounded(proc, 120) == 0
    finally:
        proc.kill()
    assert len(job) == 12 and gone(seen)


@pytest.mark.slow  # subprocesses
def test_a_worker_that_cannot_join_says_so_within_its_timeout_and_ctrl_c_ends_the_wait(
        fashion_dir, tmp_path):
    # A "scheduler" that takes connections and never answers: MXNet waits there for good.
    with socket.socket() as silent:
        silent.bind(('127.0.0.1', 0))
        silent.listen()
        silent.settimeout(120)
        port = silent.getsockname()[1]
        env = dict(os.environ, DMLC_ROLE='worker', DMLC_PS_ROOT_URI='127.0.0.1',
                   DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER='1', DMLC_NUM_WORKER='2',
                   GLUON_MULTIGPU_JOIN_TIMEOUT='3')
        argv = [sys.executable, TRAIN, '--kvstore', 'dist_sync', '--cpu-devices', '1',
                *train_args(fashion_dir)]
        proc = run_bounded(argv, env=env, cwd=tmp_path, timeout=120)
        assert proc.returncode == 1 and proc.stderr == (
            f'error: could not join the parameter server at 127.0.0.1:{port} within 3 s: the '
            'scheduler is not reachable from this host, or not every worker and server '
            "started; check the launcher's other lines (set GLUON_MULTIGPU_JOIN_TIMEOUT to "
            'wait longer)\n'), proc.stderr
        # What the first worker sent, if it got so far before its 3 s ran out (on a loaded
        # machine it may not have: its process has ended, so no connection comes later)
        silent.settimeout(0)
        try:
            while True:
                silent.accept()[0].close()
        except BlockingIOError:
            pass
        silent.settimeout(120)
        # Ctrl-C while MXNet waits to join: acknowledged, and the process ends with one line
        env['GLUON_MULTIGPU_JOIN_TIMEOUT'] = '600'
        proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            err = Lines(proc.stderr)
            Lines(proc.stdout)
            silent.accept()[0].close()  # it is in MXNet's join, its handler set before
            proc.send_signal(signal.SIGINT)
            assert wait_bounded(proc, 30) == 130
        finally:
            proc.kill()
    assert err.text() == ['Ctrl-C: stopping while joining the parameter server',
                          f'interrupted by SIGINT while joining the parameter server at '
                          f'127.0.0.1:{port}: nothing was trained']


@pytest.mark.slow
@pytest.mark.parametrize('how', [signal.SIGHUP, signal.SIGKILL])
def test_the_launcher_hung_up_or_killed_leaves_no_process(how, fashion_dir, tmp_path):
    proc = subprocess.Popen([sys.executable, LAUNCH, '-n', '2', '-s', '1', '--', sys.executable,
                             TRAIN, '--kvstore', 'dist_sync', '--cpu-devices', '1',
                             *train_args(fashion_dir)[:-6], '--num-epochs', '50',
                             '--data-dir', str(fashion_dir), '--progress-interval', '0.5'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            # a SIGHUP ignored (the suite run under nohup) stays ignored: not here
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        job, seen = watch_children(proc, Lines(proc.stdout), r'epoch (1/50: |\d+: \d+/\d+ batches)')
        assert len(job) == 12  # 4 agents, their 4 keepers, the keepers' 4 processes
        proc.send_signal(how)
        status = wait_bounded(proc, 90)
    finally:
        proc.kill()
    if how == signal.SIGHUP:  # an ordered stop: the workers on one step, then the others
        assert status == 129
        assert 'launch: stopped by SIGHUP: every process has ended' in proc.stderr.read()
    assert gone(seen, timeout=10)


@pytest.mark.slow  # subprocesses
def test_a_command_with_bad_input_is_status_2_and_not_restarted(tmp_path):
    proc = run_bounded([sys.executable, LAUNCH, '-n', '2', '--max-restarts', '3', '--',
                        sys.executable, TRAIN, '--kvstore', 'dist_sync', '--cpu-devices', '1',
                        '--model', 'simple-cnn', '--data-dir', str(tmp_path / 'nothing'),
                        '--checkpoint-dir', str(tmp_path / 'ck')], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert 'stopped on bad input (status 2), which a restart would meet again' in proc.stderr
    assert 'restart 1' not in proc.stderr and 'Traceback' not in proc.stdout + proc.stderr
    assert not (tmp_path / 'ck').exists()

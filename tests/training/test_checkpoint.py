"""Checkpoints and resume: killed runs continue exactly; damaged or foreign ones are refused."""
import json
import os
import re
import signal
import subprocess
import sys
import threading

import mxnet as mx
import numpy as onp
import pytest
from mxnet import np

import gluon_multigpu as gm
from gluon_multigpu.filesafety import fs
from checkpoint_files import assert_same_run, figures, manifest, saved_params
from conftest import REPO, load_script, run_bounded, wait_bounded

SCRIPT = str(REPO / 'scripts' / 'train.py')


def argv(fashion_dir, ckpt, *extra, epochs=3, devices=2):
    return ['--cpu-devices', str(devices), '--model', 'simple-cnn', '--num-epochs', str(epochs),
            '--num-train', '1920', '--num-test', '300', '--batch-size', '64', '--lr', '0.2',
            '--data-dir', str(fashion_dir), '--checkpoint-dir', str(ckpt), *map(str, extra)]


def run(args, **kw):
    return run_bounded([sys.executable, SCRIPT, *args], timeout=600, **kw)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, fashion_dir):
    """Three epochs without interruption: the run the resumed ones must match."""
    ckpt = tmp_path_factory.mktemp('whole') / 'ckpt'
    proc = run(argv(fashion_dir, ckpt, '--progress-interval', '0'))
    assert proc.returncode == 0, proc.stderr
    assert manifest(ckpt)['epoch'] == 3 and manifest(ckpt)['partial'] is None
    return ckpt


def start_and_wait_for(args, epoch, batches, timeout=300):
    """Start the script; return the process once its progress shows ``batches`` of ``epoch``.

    Past ``timeout`` seconds the process is killed and the test fails.
    """
    proc = subprocess.Popen([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    progress = re.compile(rf'  kvstore \w+ on \d+ CPUs?: epoch {epoch}: (\d+)/')
    try:
        for line in proc.stderr:
            match = progress.match(line)
            if match and int(match.group(1)) >= batches:
                return proc
    finally:
        timer.cancel()
    raise AssertionError(f'the run ended (or was killed after {timeout} s) before epoch '
                         f'{epoch}, batch {batches}: {wait_bounded(proc)}')


@pytest.mark.slow
def test_sigkill_in_the_middle_of_an_epoch_then_resume_matches(uninterrupted, fashion_dir,
                                                                tmp_path):
    ckpt = tmp_path / 'ckpt'
    args = argv(fashion_dir, ckpt, '--progress-interval', '0.05')
    proc = start_and_wait_for(args, 2, 10)
    proc.kill()  # SIGKILL: no handler runs, no checkpoint of the partial epoch
    wait_bounded(proc)
    assert proc.returncode == -signal.SIGKILL
    state = manifest(ckpt)
    assert state['epoch'] == 1 and state['partial'] is None  # the last complete checkpoint
    resumed = run(args[:-2] + ['--progress-interval', '0', '--resume'])
    assert resumed.returncode == 0, resumed.stderr
    assert f'resuming from the checkpoint epoch 1, in {ckpt}' in resumed.stdout
    assert resumed.stdout.count('epoch 1/3:') == 1 and 'epoch 3/3:' in resumed.stdout
    assert_same_run(ckpt, uninterrupted)
    assert sorted(os.listdir(ckpt)) == ['ckpt-000003.params', 'ckpt-000003.states',
                                        'manifest.json']


@pytest.mark.slow
@pytest.mark.parametrize('sig, status', [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_checkpoints_the_partial_epoch_and_resume_matches(uninterrupted, fashion_dir,
                                                                    tmp_path, sig, status):
    ckpt = tmp_path / 'ckpt'
    args = argv(fashion_dir, ckpt, '--progress-interval', '0.05')
    proc = start_and_wait_for(args, 2, 7)
    proc.send_signal(sig)
    err = proc.stderr.read().splitlines()
    assert wait_bounded(proc) == status
    name = signal.Signals(sig).name
    last = err[-1]
    assert last.startswith(f'interrupted by {name} in epoch 2 after ') and 'Traceback' not in last
    assert f'; checkpoint in {ckpt}; resume with: python ' in last and last.endswith(' --resume')
    state = manifest(ckpt)
    batches = int(last.split(' after ')[1].split(' ')[0])
    assert state['epoch'] == 1 and state['partial']['batches'] == batches and 7 <= batches < 30
    resumed = run(args + ['--resume'])
    assert resumed.returncode == 0, resumed.stderr
    assert f'resuming from the checkpoint {batches} batch(es) into epoch 2' in resumed.stdout
    assert_same_run(ckpt, uninterrupted)


@pytest.mark.slow
def test_a_checkpoint_from_two_devices_resumes_on_three(uninterrupted, fashion_dir, tmp_path):
    ckpt = tmp_path / 'ckpt'
    first = run(argv(fashion_dir, ckpt, '--progress-interval', '0', epochs=2))
    assert first.returncode == 0, first.stderr
    resumed = run(argv(fashion_dir, ckpt, '--progress-interval', '0', '--resume', devices=3))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.rstrip().endswith('on [cpu(0), cpu(1), cpu(2)]')
    # a different split changes only the order of float additions
    assert_same_run(ckpt, uninterrupted, rtol=1e-4)


@pytest.mark.slow
def test_existing_foreign_and_damaged_checkpoints_are_refused(uninterrupted, fashion_dir,
                                                              tmp_path, capsys, unwritable_dir):
    train = load_script('train')

    def answer(ckpt, *extra):
        status = train.main(argv(fashion_dir, ckpt, *extra))
        captured = capsys.readouterr()
        assert status == 2 and captured.out == '', captured
        assert len(captured.err.splitlines()) == 1 and 'Traceback' not in captured.err
        return captured.err

    def copy(name):
        d = tmp_path / name
        d.mkdir()
        for f in os.listdir(uninterrupted):
            (d / f).write_bytes((uninterrupted / f).read_bytes())
        return d
    assert 'already holds a checkpoint (epoch 3' in answer(copy('existing'))
    assert 'add --resume to continue it' in answer(tmp_path / 'existing')
    other = copy('other')
    m = manifest(other)
    m['config']['model'] = 'resnet18'
    (other / 'manifest.json').write_text(json.dumps(m))
    assert 'is of another run: --model resnet18 (now simple-cnn)' in answer(other, '--resume')
    # a setting recorded only where a run differs from a plain one is named with the plain value
    bfloat16 = copy('bfloat16')
    m = manifest(bfloat16)
    m['config']['dtype'] = 'bfloat16'
    (bfloat16 / 'manifest.json').write_text(json.dumps(m))
    assert 'is of another run: --dtype bfloat16 (now float32);' in answer(bfloat16, '--resume')
    assert "lr 0.2 (now 0.1)" in answer(copy('lr'), '--resume', '--lr', '0.1')
    truncated = copy('truncated')
    params = truncated / manifest(truncated)['files']['params']['name']
    params.write_bytes(params.read_bytes()[:1000])
    assert 'is damaged: ckpt-000003.params does not match its recorded hash' in \
        answer(truncated, '--resume')
    garbled = copy('garbled')
    (garbled / 'manifest.json').write_text('{"format": ')
    assert 'is damaged: cannot read manifest.json' in answer(garbled, '--resume')
    missing = copy('missing')
    os.remove(missing / manifest(missing)['files']['states']['name'])
    assert 'its states file ckpt-000003.states is missing' in answer(missing, '--resume')
    assert 'has 3 epochs done, more than the 2 asked for' in answer(copy('past'), '--resume',
                                                                    '--num-epochs', '2')
    assert 'does not exist; create it first' in answer(tmp_path / 'no' / 'such')
    assert f'cannot create files in {unwritable_dir}' in answer(os.path.join(unwritable_dir, 'c'))
    (tmp_path / 'file').write_text('x')
    assert 'is a file; give a directory' in answer(tmp_path / 'file')
    assert 'give a single --kvstore' in answer(tmp_path / 'two', '--kvstore', 'local', 'device')
    status = train.main(['--cpu-devices', '2', '--resume'])
    assert status == 2 and '--resume needs --checkpoint-dir' in capsys.readouterr().err


def test_divergence_stops_naming_the_step_and_keeps_the_last_good_checkpoint(fashion_test,
                                                                             tmp_path):
    images, labels = fashion_test
    X = np.array(images[:256, None] / 255.0, dtype='float32')
    y = np.array(labels[:256], dtype='int32')

    class Batches:
        """Four batches; in epoch 2 the third one holds a NaN."""
        epoch = 0

        def __iter__(self):
            self.epoch += 1
            for i in range(4):
                xb = X[i * 64:(i + 1) * 64]
                if self.epoch == 2 and i == 2:
                    xb = xb * float('nan')
                yield xb, y[i * 64:(i + 1) * 64]
    ckpt = gm.Checkpointer(tmp_path / 'ckpt', {'run': 'nan'})
    net = gm.simple_cnn()
    seen = []
    with pytest.raises(gm.TrainingDiverged) as stop:
        gm.train(net, Batches(), [(X, y)], gm.cpu_devices(2), num_epochs=3, lr=0.1, seed=0,
                 initializer=gm.default_initializer('simple-cnn'), hooks=[ckpt],
                 on_epoch=lambda r: seen.append(gm.compare.param_arrays(net)))
    # MXNet's ReLU maps NaN to 0, so the loss stays finite: the parameters show it, at the
    # epoch's end (the one read-back of the epoch: no check adds work to every step)
    first = list(net.collect_params().values())[0].name  # the layer that saw the NaN
    said = str(stop.value)  # (the wording: tests/training/test_messages.py)
    assert said.startswith(f'parameter {first} became non-finite by step 4 in epoch 2; ')
    assert 'it is 0.1' in said and f'checkpoint (epoch 1, in {tmp_path / "ckpt"}) is kept' in said
    assert stop.value.epoch == 2
    state = manifest(tmp_path / 'ckpt')
    assert state['epoch'] == 1 and len(state['history']) == 1
    saved = list(saved_params(tmp_path / 'ckpt').values())
    assert len(seen) == 1 and all(onp.isfinite(a).all() for a in saved)
    for a, b in zip(sorted(saved, key=lambda a: a.size), sorted(seen[0], key=lambda a: a.size)):
        onp.testing.assert_array_equal(a, b)


def test_a_non_finite_parameter_is_caught():
    net = gm.simple_cnn()
    net.initialize(ctx=gm.cpu_devices(2))
    net(np.zeros((1, 1, 28, 28), ctx=mx.cpu(0)))
    gm.training.check_finite_params(net)  # finite: passes
    param = list(net.collect_params().values())[3]
    param.data(mx.cpu(0))[0] = float('inf')
    with pytest.raises(gm.TrainingDiverged, match=f'^parameter {param.name} became non-finite$'):
        gm.training.check_finite_params(net)


def test_a_non_finite_loss_is_named_by_its_step(fashion_test):
    images, labels = fashion_test
    X = np.array(images[:64, None] / 255.0, dtype='float32')
    y = np.array(labels[:64], dtype='int32')
    # the loss of step 3 is NaN (a NaN logit reaches the loss: no ReLU after the last layer)
    batches = [(X, y), (X, y), (X, y), (X, y)]
    net = gm.simple_cnn()
    net.initialize(gm.default_initializer('simple-cnn'), ctx=gm.cpu_devices(2))
    trainer = gm.kvstores.make_trainer(net, 0.1, 'device')
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()

    class NanAtThree(mx.gluon.loss.SoftmaxCrossEntropyLoss):
        calls = 0

        def forward(self, pred, label):  # pylint: disable=arguments-differ
            NanAtThree.calls += 1
            out = loss(pred, label)
            return out * float('nan') if NanAtThree.calls in (5, 6) else out
    with pytest.raises(gm.TrainingDiverged, match='^the training loss became non-finite at step '
                                                  '3$') as stop:
        steps = gm.train_epoch(gm.Step(net, NanAtThree(), trainer, gm.cpu_devices(2)), batches)
        assert steps.batches == 4 and steps.samples == 256  # queued: nothing read back yet
        mx.npx.waitall()
        steps.totals(1.0)
    assert stop.value.step == 3


class Boom(Exception):
    pass


@pytest.mark.parametrize('stage', ['params', 'states', 'manifest'])
def test_a_crash_during_a_save_leaves_the_last_complete_checkpoint(tmp_path, monkeypatch, stage):
    devices = gm.cpu_devices(2)
    net = gm.simple_cnn()
    net.initialize(gm.default_initializer('simple-cnn'), ctx=devices)
    trainer = gm.training.make_trainer(net, 0.1, 'device')
    X = np.ones((8, 1, 28, 28))
    gm.train_batch(net, X, np.zeros(8, dtype='int32'), mx.gluon.loss.SoftmaxCrossEntropyLoss(),
                   trainer, devices)
    ckpt = gm.Checkpointer(tmp_path, {'k': 1})
    history = [gm.EpochRecord(e, 1.0, 0.5, 0.5, 1.0, 0.1, 8) for e in (1, 2)]
    ckpt.save(net, trainer, history[:1], 1)
    before = saved_params(tmp_path)
    for p in net.collect_params().values():  # the next epoch changes every parameter
        for d in p.list_data():
            d[:] = d + 1
    if stage == 'manifest':
        def hook(operation, path):  # the new manifest is written, in the save's folder
            if operation == 'write' and os.path.basename(path) == 'manifest.json':
                raise Boom()
        monkeypatch.setattr(fs, 'hook', hook)
    else:
        owner = net if stage == 'params' else gm.checkpoint_store
        method = 'save_parameters' if stage == 'params' else 'save_trainer_states'
        real = getattr(owner, method)

        def half_write(*args):
            real(*args)
            with open(args[-1], 'r+b') as f:
                f.truncate(100)  # the crash hits mid-write
            raise Boom()
        monkeypatch.setattr(owner, method, half_write)
    with pytest.raises(Boom):
        ckpt.save(net, trainer, history, 2)
    monkeypatch.undo()
    state = gm.Checkpointer(tmp_path, {'k': 1}).load()
    assert state.epoch == 1
    after = saved_params(tmp_path)
    for k in before:
        onp.testing.assert_array_equal(before[k], after[k])
    assert sorted(os.listdir(tmp_path)) == ['ckpt-000001.params', 'ckpt-000001.states',
                                            'manifest.json']


def test_a_run_diverging_in_its_first_epoch_leaves_no_checkpoint(fashion_dir, tmp_path, capsys):
    ckpt = tmp_path / 'ckpt'
    args = argv(fashion_dir, ckpt, '--progress-interval', '0')
    args[args.index('--lr') + 1] = '10000'
    assert load_script('train').main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert re.search(r'non-finite at step \d+ in epoch 1; lower the learning rate \(it is '
                     r'10000.0\)$', err.strip())
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_sigterm_without_a_checkpoint_dir_says_how_to_keep_one(fashion_dir):
    args = argv(fashion_dir, 'unused')[:-2] + ['--progress-interval', '0.05']
    proc = start_and_wait_for(args, 1, 3)
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read().splitlines()
    assert wait_bounded(proc) == 143
    assert re.match(r'interrupted by SIGTERM in epoch 1 after \d+ batch\(es\); no checkpoint '
                    r'written \(add --checkpoint-dir DIR to be able to resume\)$', err[-1])


def _batch():
    """16 random images and labels (the same every call)."""
    rng = onp.random.RandomState(0)
    return (np.array(rng.rand(16, 1, 28, 28).astype('float32')),
            np.array(rng.randint(0, 10, 16).astype('int32')))


def _trained_pair(devices, kvstore, optimizer, options, seed=None):
    """A simple CNN on ``devices`` and its Trainer (the package's own for kvstore 'none')."""
    net = gm.simple_cnn()
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(gm.default_initializer('simple-cnn'), ctx=devices)
    if kvstore == 'none':
        return net, gm.kvstores.ReducingTrainer(net.collect_params(), optimizer, options)
    return net, mx.gluon.Trainer(net.collect_params(), optimizer, options, kvstore=kvstore)


@pytest.mark.parametrize('optimizer, options', [('sgd', {'learning_rate': 0.05, 'momentum': 0.9}),
                                                ('adam', {'learning_rate': 0.001})])
@pytest.mark.parametrize('kvstore', ['device', 'none'])
def test_the_optimizer_state_file_continues_training_exactly(tmp_path, optimizer, options,
                                                             kvstore):
    """Momentum and Adam's moments and step counts go through the array file, not a pickle."""
    devices = gm.cpu_devices(2)
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    X, y = _batch()

    def make():
        return _trained_pair(devices, kvstore, optimizer, options, seed=1)

    def steps(net, trainer, n=3):
        for _ in range(n):
            gm.train_batch(net, X, y, loss, trainer, devices)
        return [p.data(devices[1]).asnumpy() for p in net.collect_params().values()]
    net, trainer = make()
    steps(net, trainer)
    net.save_parameters(str(tmp_path / 'p'))
    gm.states.save_trainer_states(net, trainer, str(tmp_path / 's'))
    assert (tmp_path / 's').read_bytes()[:1] != b'\x80'  # not a pickle
    whole = steps(net, trainer)
    resumed, fresh = make(), make()
    for n, t in (resumed, fresh):
        n.load_parameters(str(tmp_path / 'p'), ctx=devices)
    gm.states.load_trainer_states(*resumed, str(tmp_path / 's'))
    for a, b in zip(whole, steps(*resumed)):
        onp.testing.assert_array_equal(a, b)  # the same operations on the same numbers
    # and the state mattered: without it the steps differ
    assert max(float(abs(a - b).max()) for a, b in zip(whole, steps(*fresh))) > 1e-4


def _next_counter(make_block):
    """The counter the next block of this kind gets in its name (``conv41_`` -> 41)."""
    return int(re.search(r'(\d+)_$', make_block().prefix).group(1)) + 1


@pytest.mark.parametrize('kvstore', ['device', 'none'])
def test_the_state_follows_the_network_when_a_names_counter_crosses_a_power_of_ten(
        tmp_path, kvstore):
    """A Trainer orders parameters by name, and ``conv9_`` sorts after ``conv10_``: the saving
    network has its two convolutions at conv9/conv10, the resuming one at conv11/conv12, and
    the momentum still reaches each parameter (keyed by place in the network, checked by
    value against the saving Trainer's own)."""
    devices = gm.cpu_devices(2)
    conv = lambda: mx.gluon.nn.Conv2D(1, 1)  # noqa: E731  (a block to move the counter)
    for _ in range((9 - _next_counter(conv)) % 10):
        conv()
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    X, y = _batch()

    def make():
        return _trained_pair(devices, kvstore, 'sgd', {'learning_rate': 0.05, 'momentum': 0.9})
    net, trainer = make()
    names = [p.name for p in net.collect_params().values()]
    assert re.match(r'conv\d*9_', names[0])  # and conv10_ sorts first in its Trainer
    gm.train_batch(net, X, y, loss, trainer, devices)
    gm.states.save_trainer_states(net, trainer, str(tmp_path / 's'))
    net.save_parameters(str(tmp_path / 'p'))
    other, resumed = make()
    shapes = lambda t: [p.shape for p in t._params]  # noqa: E731  (in the Trainer's order)
    assert shapes(trainer) != shapes(resumed)  # an index names another parameter in each
    other.load_parameters(str(tmp_path / 'p'), ctx=devices)
    gm.states.load_trainer_states(other, resumed, str(tmp_path / 's'))
    saved = gm.states._updaters(trainer)[0].states
    loaded = gm.states._updaters(resumed)[0].states
    for mine, theirs in zip(net.collect_params().values(), other.collect_params().values()):
        a = saved[trainer._param2idx[mine.name]]
        b = loaded[resumed._param2idx[theirs.name]]
        onp.testing.assert_array_equal(a.asnumpy(), b.asnumpy())  # its own momentum


class KilledAfterItsManifest(gm.Checkpointer):
    """A Checkpointer whose saves die after the new manifest, before the old files go."""

    def _clean(self, replaced, keep):
        if replaced:  # the clean-up after the manifest: the process is gone by then
            return
        super()._clean(replaced, keep)


def test_a_save_killed_after_its_manifest_leaves_nothing_foreign(tmp_path):
    devices = gm.cpu_devices(2)
    net = gm.simple_cnn()
    net.initialize(gm.default_initializer('simple-cnn'), ctx=devices)
    trainer = gm.training.make_trainer(net, 0.1, 'device')
    gm.train_batch(net, np.ones((8, 1, 28, 28)), np.zeros(8, dtype='int32'),
                   mx.gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
    history = [gm.EpochRecord(e, 1.0, 0.5, 0.5, 1.0, 0.1, 8) for e in (1, 2, 3)]
    gm.Checkpointer(tmp_path, {'k': 1}).save(net, trainer, history[:1], 1)
    killed = KilledAfterItsManifest(tmp_path, {'k': 1}, resume=True)
    killed.load()
    killed.save(net, trainer, history[:2], 2)
    assert {'ckpt-000001.params', 'ckpt-000002.params'} <= set(os.listdir(tmp_path))
    resumed = gm.Checkpointer(tmp_path, {'k': 1}, resume=True)
    with resumed:
        resumed.check_directory(3)  # the old files are the killed save's to remove, not foreign
        assert resumed.load().epoch == 2
        resumed.save(net, trainer, history, 3)
    assert sorted(os.listdir(tmp_path)) == ['ckpt-000003.params', 'ckpt-000003.states',
                                            'manifest.json']


def test_a_states_file_of_version_1_is_read_by_the_trainers_index(tmp_path):
    """Files written before version 2 key the state by the Trainer's index: still read so."""
    devices = gm.cpu_devices(2)
    net = gm.simple_cnn()
    net.initialize(gm.default_initializer('simple-cnn'), ctx=devices)
    trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05,
                                                               'momentum': 0.9})
    X = np.array(onp.random.RandomState(0).rand(8, 1, 28, 28).astype('float32'))
    gm.train_batch(net, X, np.zeros(8, dtype='int32'), mx.gluon.loss.SoftmaxCrossEntropyLoss(),
                   trainer, devices)
    gm.states.save_trainer_states(net, trainer, str(tmp_path / 'v2'))
    arrays = mx.nd.load(str(tmp_path / 'v2'))
    index_of = {place: i for i, place in enumerate(gm.states._places(net, trainer))}
    layout = arrays.pop('layout').asnumpy().reshape(-1, 4)
    old = {f'state:{index_of[k]}': arrays.pop(f'state:{k}') for k, *_ in layout}
    layout[:, 0] = [index_of[k] for k in layout[:, 0]]
    counts = arrays.pop('counts').asnumpy().reshape(-1, 3)
    counts[:, 1] = [index_of[k] for k in counts[:, 1]]
    del arrays['version']
    old.update(arrays, layout=mx.nd.array(layout.reshape(-1), dtype='int64'),
               counts=mx.nd.array(counts.reshape(-1), dtype='int64'))
    mx.nd.save(str(tmp_path / 'v1'), old)
    fresh = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05,
                                                             'momentum': 0.9})
    gm.states.load_trainer_states(net, fresh, str(tmp_path / 'v1'))
    saved, loaded = (gm.states._updaters(t)[0].states for t in (trainer, fresh))
    assert sorted(saved) == sorted(loaded) == list(range(len(trainer._params)))
    for i in saved:
        onp.testing.assert_array_equal(saved[i].asnumpy(), loaded[i].asnumpy())

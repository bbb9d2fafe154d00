"""The library's contract under faults (issue 26): what ``train`` and ``Training`` do when a hook,
an argument, the data, a thread or a repeated signal is not what the loop expects.

A ``Training`` is built whole or not at all; a hook that fails in ``begin``
leaves the checkpoint to resume; bad learning rates, device lists, labels,
input shapes and batches are one-line ``GluonMultiGPUError``s naming the
value; ``train`` works in any thread; a SIGINT repeated within the window is
the same request, also once the fit has raised.
"""
import dataclasses
import os
import signal
import subprocess
import sys
import threading

import mxnet as mx
import numpy as onp
import pytest
from mxnet import np as mnp
from mxnet.gluon import nn

import gluon_multigpu as gm
from gluon_multigpu.base.values import MAX_SEED
from gluon_multigpu.observe import stopping
from conftest import REPO, Lines, wait_bounded

STEPS = 3


def data(seed=0):
    return gm.data.synthetic_data('fashion-mnist', 16, num_train=16 * STEPS, num_test=16,
                                  seed=seed, num_devices=2)


def one_line(error):
    text = str(error.value)
    assert '\n' not in text and 'Traceback' not in text
    return text


# -- 1. a hook failing in begin leaves resume intact ---------------------------------------------

class FailsInBegin(gm.Hook):
    """Raises in ``begin`` the first ``times`` times."""

    def __init__(self, times=1):
        self.times = times

    def begin(self, run):
        if self.times:
            self.times -= 1
            raise RuntimeError('a hook failed in begin')


class Steps(gm.Hook):
    """Counts the steps taken, per epoch."""

    def __init__(self):
        self.epochs = []

    def step_end(self, run, step, samples, timer):
        self.epochs.append(run.epoch)


def checkpointed(tmp_path, epochs=3):
    train_iter, test_iter = data()
    gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=epochs,
             hooks=[gm.Checkpointer(tmp_path / 'ckpt', {'run': 'faults'})])
    return tmp_path / 'ckpt'


def resuming(directory, *hooks):
    train_iter, test_iter = data()
    return gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2),
                       hooks=[*hooks, gm.Checkpointer(directory, {'run': 'faults'}, resume=True)])


def test_a_hook_failing_in_begin_then_fit_resumes_from_the_checkpoint(tmp_path):
    steps = Steps()
    run = resuming(checkpointed(tmp_path), steps, FailsInBegin())
    with pytest.raises(RuntimeError, match='a hook failed in begin'):
        run.fit(5)
    assert gm.last_run() is run and steps.epochs == []
    result = gm.last_run().fit()  # begins properly now: the checkpoint's epochs 1-3, then 4-5
    assert [e.epoch for e in result.epochs] == [1, 2, 3, 4, 5]
    assert steps.epochs == [4] * STEPS + [5] * STEPS


def test_a_repaired_checkpoint_is_resumed_by_the_next_fit(tmp_path):
    directory = checkpointed(tmp_path)
    manifest = directory / 'manifest.json'
    good = manifest.read_bytes()
    manifest.write_bytes(b'{"damaged": ')
    steps = Steps()
    run = resuming(directory, steps)
    with pytest.raises(gm.GluonMultiGPUError):
        run.fit(5)
    manifest.write_bytes(good)  # repaired
    result = run.fit()
    assert [e.epoch for e in result.epochs] == [1, 2, 3, 4, 5]
    assert steps.epochs == [4] * STEPS + [5] * STEPS


# -- 2. a Training is built whole or not at all --------------------------------------------------

def test_a_setup_hook_that_raises_leaves_last_run_as_it_was():
    class FailsInSetup(gm.Hook):
        def setup(self, run):
            raise RuntimeError('setup failed')
    train_iter, test_iter = data()
    before = gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2))
    with pytest.raises(RuntimeError, match='setup failed'):
        gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2),
                    hooks=[FailsInSetup()])
    assert gm.last_run() is before


# -- 3. learning rates and epochs ---------------------------------------------------------------

@pytest.mark.parametrize('lr', [1e300, 1e39, float('inf'), float('nan'), 0, -0.1, 1e-50, True,
                                onp.bool_(True), '0.1', None])
def test_a_learning_rate_float32_cannot_hold_is_one_line_naming_it(lr):
    train_iter, test_iter = data()
    kwargs = {'lr': lr} if lr is not None else {'lr': [0.1]}
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=1,
                 **kwargs)
    assert repr(kwargs['lr']) in one_line(error) and 'learning rate' in str(error.value)


def test_numpy_scalars_are_numbers_bools_are_not():
    train_iter, test_iter = data()
    result = gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2),
                      num_epochs=onp.int64(1), lr=onp.float32(0.1))
    assert len(result.epochs) == 1 and isinstance(result.lr, float)
    assert result.lr == pytest.approx(0.1)
    with pytest.raises(gm.GluonMultiGPUError, match='got True'):
        gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=True)
    with pytest.raises(gm.GluonMultiGPUError, match='got 1.0'):
        gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=1.0)


# -- 4. device lists -----------------------------------------------------------------------------

@pytest.mark.parametrize('devices, named', [
    ([mx.cpu(0), mx.cpu(0)], 'cpu(0)'),
    ([mx.cpu(0), mx.cpu(1), mx.cpu(1)], 'cpu(1)'),
    ([mx.gpu(0)], 'gpu(0)'),
    ('cpu', "'cpu'"),
    (['cpu(0)', 'cpu(1)'], "'cpu(0)'"),
    (mx.cpu(0), 'cpu(0)'),
    ([mx.cpu(0), 3], '3'),
])
@pytest.mark.parametrize('how', ['train', 'Training'])
def test_device_lists_mxnet_cannot_use_are_one_line_naming_them(devices, named, how):
    if named == 'gpu(0)' and gm.num_gpus() > 0:
        pytest.skip('a GPU exists here')
    train_iter, test_iter = data()
    with pytest.raises(gm.DeviceError) as error:
        if how == 'train':
            gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=1)
        else:
            gm.Training(gm.simple_cnn(), train_iter, test_iter, devices)
    assert named in one_line(error)


# -- 5. labels, shapes and batches the network cannot take --------------------------------------

def batches_of(X, y, steps=2):
    return [(mnp.array(X), mnp.array(y)) for _ in range(steps)]


def images(n=8, shape=(1, 28, 28)):
    return onp.random.default_rng(0).random((n, *shape), dtype=onp.float32)


@pytest.mark.parametrize('bad', [99, -5, 10])
def test_labels_outside_the_networks_classes_are_one_line_naming_them(bad):
    labels = onp.zeros(8, dtype='int32')
    labels[3] = bad
    train_iter = batches_of(images(), labels)
    with pytest.raises(gm.DataError) as error:
        gm.train(gm.simple_cnn(), train_iter, None, gm.cpu_devices(2), num_epochs=1, lr=0.1)
    assert f'label {bad}' in one_line(error) and '10 classes' in str(error.value)


def test_a_loaders_labels_outside_the_classes_are_refused_before_a_step():
    labels = onp.zeros(64, dtype='int32')
    labels[50] = 99  # in the fourth batch: the loader's labels are checked as a whole
    loader = gm.data.ArrayLoader(onp.zeros((64, 28, 28), 'uint8'), labels, 16)
    run = gm.Training(gm.simple_cnn(), loader, None, gm.cpu_devices(2), lr=0.1)
    with pytest.raises(gm.DataError, match='label 99'):
        run.fit(1)
    assert run.trainer.optimizer.num_update == 0


@pytest.mark.parametrize('shape', [(28, 28), (1, 3, 3), (1, 1, 28, 28)])
def test_inputs_the_network_cannot_take_are_one_line_naming_the_shape(shape):
    train_iter = batches_of(images(shape=shape), onp.zeros(8, 'int32'))
    with pytest.raises(gm.DataError) as error:
        gm.train(gm.simple_cnn(), train_iter, None, gm.cpu_devices(2), num_epochs=1, lr=0.1)
    assert f'{(8, *shape)}' in one_line(error)


def test_a_later_batch_of_another_shape_is_one_line():
    train_iter = batches_of(images(), onp.zeros(8, 'int32'))
    train_iter.append((mnp.array(images(shape=(1, 32, 32))), mnp.zeros(8, dtype='int32')))
    with pytest.raises(gm.DataError) as error:
        gm.train(gm.simple_cnn(), train_iter, None, gm.cpu_devices(2), num_epochs=1, lr=0.1)
    assert '(8, 1, 32, 32)' in one_line(error)


@pytest.mark.parametrize('make, named', [
    (lambda X, y: X, 'ndarray of shape (8, 1, 28, 28)'),
    (lambda X, y: (X, y, y), 'tuple of 3'),
    (lambda X, y: [X], 'list of 1'),
])
def test_batches_that_are_not_pairs_are_one_line(make, named):
    X, y = mnp.array(images()), mnp.zeros(8, dtype='int32')
    with pytest.raises(gm.DataError) as error:
        gm.train(gm.simple_cnn(), [make(X, y)] * 2, None, gm.cpu_devices(2), num_epochs=1,
                 lr=0.1)
    assert named in one_line(error)
    with pytest.raises(gm.DataError, match='pair'):  # evaluation takes the same
        gm.evaluate_accuracy_gpus(gm.simple_cnn(), [make(X, y)], gm.cpu_devices(2))


@pytest.mark.parametrize('make', [
    lambda y: y + 0.5,                               # NumPy float64 labels
    lambda y: mnp.array(y, dtype='float32') + 0.5,   # MXNet float32 labels
    lambda y: onp.full(y.shape, onp.nan, 'float32'),
])
def test_labels_that_are_not_whole_numbers_are_one_line_in_training_and_evaluation(make):
    """Float labels used to train silently to accuracy 0; whole floats still train."""
    labels = onp.arange(8) % 10
    with pytest.raises(gm.DataError) as error:
        gm.train(gm.simple_cnn(), [(mnp.array(images()), make(labels))] * 2, None,
                 gm.cpu_devices(2), num_epochs=1, lr=0.1)
    assert 'in the training data is not a class number' in one_line(error)
    good = batches_of(images(), labels.astype('int32'))
    with pytest.raises(gm.DataError) as error:
        gm.train(gm.simple_cnn(), good, [(mnp.array(images()), make(labels))], gm.cpu_devices(2),
                 num_epochs=1, lr=0.1)
    assert 'in the evaluation data is not a class number' in one_line(error)
    whole = [(mnp.array(images()), labels.astype('float32'))] * 2
    result = gm.train(gm.simple_cnn(), whole, whole, gm.cpu_devices(2), num_epochs=1, lr=0.1)
    assert result.epochs[0].test_acc is not None


def test_an_iterator_as_training_data_is_refused_where_it_would_be_used_up():
    """A generator used to give 'the training data is empty' in epoch 2."""
    good = batches_of(images(), onp.arange(8, dtype='int32'))
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.train(gm.simple_cnn(), iter(good), None, gm.cpu_devices(2), num_epochs=2, lr=0.1)
    assert 'is gone through once, and 2 epochs were asked for' in one_line(error)
    run = gm.Training(gm.simple_cnn(), (b for b in good), None, gm.cpu_devices(2), lr=0.1)
    assert len(run.fit(1).epochs) == 1  # one epoch: it is gone through once
    with pytest.raises(gm.GluonMultiGPUError) as error:
        run.fit(1)
    assert 'was used up by the epochs trained so far' in one_line(error)


@pytest.mark.parametrize('seed', [-1, 2**32, 1.5, True, '0'])
def test_a_seed_the_cli_refuses_is_refused_by_the_library(seed):
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.train(gm.simple_cnn(), batches_of(images(), onp.zeros(8, 'int32')), None,
                 gm.cpu_devices(2), num_epochs=1, lr=0.1, seed=seed)
    assert f'seed must be a whole number 0 to {MAX_SEED}' in one_line(error)


def test_one_seed_gives_one_run_whether_or_not_the_loader_was_used_before():
    """Each epoch's order follows the training's epoch: the loader's own count of its uses
    (2.05806 against 2.0612 when it carried over) no longer matters."""
    train_iter, test_iter = data()
    runs = [gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=2,
                     seed=0).epochs for _ in range(2)]
    list(train_iter)  # used once more by the user
    runs.append(gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2),
                         num_epochs=2, seed=0).epochs)
    assert runs[0] == [dataclasses.replace(r, seconds=a.seconds, eval_seconds=a.eval_seconds)
                       for a, r in zip(runs[0], runs[1])]
    assert [e.train_loss for e in runs[0]] == [e.train_loss for e in runs[2]]


# -- 6. any thread -------------------------------------------------------------------------------

def test_train_works_in_a_thread_that_builds_the_network():
    devices, outcome = gm.cpu_devices(2), []

    def work():
        try:
            train_iter, test_iter = data()
            outcome.append(gm.train(gm.simple_cnn(), train_iter, test_iter, devices,
                                    num_epochs=1))
        except BaseException as e:  # pylint: disable=broad-except
            outcome.append(e)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], gm.TrainResult), outcome
    assert len(outcome[0].epochs) == 1


def _process_state():
    """What a training must leave as it found it: the streams, the stop signals' handlers, the
    environment, NumPy's settings, and no thread of its own (a thread an earlier test left,
    ending meanwhile, is not one: under load one did, and a count of threads failed)."""
    return (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__,
            [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)],
            dict(os.environ), onp.get_printoptions(), onp.geterr())


@pytest.mark.parametrize('at_once', [2, 4])
def test_trainings_from_threads_at_once_each_get_their_own_result_and_leave_the_process(
        at_once):
    """20 times, ``at_once`` trainings from as many threads: each equals the same training
    run alone, and nothing process-wide changed (the network's first-batch check used to swap
    ``sys.stdout`` from several threads and could leave it a StringIO)."""
    devices = gm.cpu_devices(2)

    def one():
        train_iter, test_iter = data()
        epochs = gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=1).epochs
        return [(e.train_loss, e.train_acc, e.test_acc) for e in epochs]
    alone = one()
    before, threads_before = _process_state(), set(threading.enumerate())
    for _ in range(20):
        results = [None] * at_once

        def work(k):
            try:
                results[k] = one()
            except BaseException as e:  # pylint: disable=broad-except
                results[k] = e
        threads = [threading.Thread(target=work, args=(k,)) for k in range(at_once)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [alone] * at_once
        assert _process_state() == before
        assert set(threading.enumerate()) <= threads_before


def test_two_trainings_at_once_on_the_same_loaders_each_get_the_result_alone():
    """The epoch's order is the run's epoch's, read from the loader without its count: two
    threads that share the loaders do not shuffle each other's epochs."""
    devices = gm.cpu_devices(2)
    train_iter, test_iter = data()

    def one():
        epochs = gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=2).epochs
        return [(e.train_loss, e.train_acc, e.test_acc) for e in epochs]
    alone = one()
    for _ in range(5):
        results = [None, None]

        def work(k):
            results[k] = one()
        threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [alone, alone]


def test_a_loader_subclass_with_its_own_iter_is_gone_through_its_own_way():
    """A subclass that says what an epoch is in ``__iter__`` (as the parameter server's
    ``WorkerShard`` did) is iterated, not read around by the run's epoch order."""
    class FirstBatchOnly(gm.data.ArrayLoader):
        def __iter__(self):
            self.epoch += 1
            yield next(iter(self.batches_of(self.epoch - 1)))
    labels = onp.arange(64, dtype='int32') % 10
    loader = FirstBatchOnly(onp.zeros((64, 28, 28), 'uint8'), labels, 16, shuffle=True)
    result = gm.train(gm.simple_cnn(), loader, None, gm.cpu_devices(2), num_epochs=2, lr=0.1)
    assert [e.samples for e in result.epochs] == [16, 16] and loader.epoch == 2


def test_a_network_built_without_numpy_semantics_is_one_line():
    built = []

    def build():  # a new thread: MXNet's NumPy semantics are off there until set
        net = nn.Sequential()
        net.add(nn.Conv2D(4, kernel_size=3), nn.Flatten(), nn.Dense(10))
        built.append(net)
    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    train_iter = batches_of(images(), onp.zeros(8, 'int32'))
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.train(built[0], train_iter, None, gm.cpu_devices(2), num_epochs=1, lr=0.1)
    assert 'npx.set_np()' in one_line(error)


# -- 7. a SIGINT repeated within the window is the same request --------------------------------

def test_a_second_sigint_within_the_window_never_escapes_the_library(monkeypatch):
    """The second comes 50 ms after the first: after the fit stopped, within the window."""
    monkeypatch.setattr(stopping, 'SAME_REQUEST', 3.0)  # wide: a loaded machine stays inside
    timers = []

    class Press(gm.Hook):
        def step_end(self, run, step, samples, timer):
            if (run.epoch, step) == (1, 2):
                os.kill(os.getpid(), signal.SIGINT)

        def stopped(self, run, totals):  # the fit raises next: the second comes after it
            timers.append(threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)))
            timers[0].start()
    said = []
    hook = gm.interrupt.Interruptible(say=said.append)
    train_iter, test_iter = data()
    escaped = False
    try:
        with pytest.raises(gm.Interrupted):
            gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=2,
                     hooks=[Press(), hook])
        timers[0].join()
        for _ in range(10000):  # Python runs a pending handler between these bytecodes
            pass
    except KeyboardInterrupt:
        escaped = True
    assert not escaped and hook.requests == 2  # both reached the hook: one request


# -- 8. the first signal decides the exit status -------------------------------------------------

@pytest.mark.slow
def test_a_sigterm_after_the_sigint_stop_keeps_its_status_and_line():
    proc = subprocess.Popen(
        [sys.executable, 'scripts/train.py', '--cpu-devices', '2', '--model', 'simple-cnn',
         '--synthetic', '--num-train', '64000', '--num-test', '64', '--num-epochs', '2',
         '--batch-size', '64', '--progress-interval', '0.2'],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = Lines(proc.stdout)
    try:
        lines.wait_for(r'batches|epoch 1', timeout=180)
        proc.send_signal(signal.SIGINT)
        lines.wait_for(r'^interrupted by SIGINT', timeout=180)
        try:
            proc.send_signal(signal.SIGTERM)  # the run is over: the process is ending
        except ProcessLookupError:
            pass
        assert wait_bounded(proc) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_bad_label_in_a_later_numpy_batch_is_refused_before_its_step():
    good, bad = onp.zeros(8, dtype='int32'), onp.zeros(8, dtype='int32')
    bad[5] = 42  # labels on the host: checked in every batch, not only an epoch's first
    train_iter = [(images(), good), (images(), bad)]
    run = gm.Training(gm.simple_cnn(), train_iter, None, gm.cpu_devices(2), lr=0.1)
    with pytest.raises(gm.DataError, match='label 42'):
        run.fit(1)
    assert run.trainer.optimizer.num_update == 1  # the first batch's step only

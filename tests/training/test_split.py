"""Unequal shares of a batch across devices (--split): every sample once, the same update."""
import functools
import json

import mxnet as mx
import numpy as onp
import pytest
from hypothesis import given, settings, strategies as st
from mxnet import gluon, init, np

import gluon_multigpu as gm
from conftest import load_script


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 600), weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=6))
def test_split_sizes_cover_the_batch_in_proportion(n, weights):
    if n < len(weights):
        with pytest.raises(gm.DeviceError, match='cannot be split'):
            gm.devices.split_sizes(n, weights)
        return
    sizes = gm.devices.split_sizes(n, weights)
    assert sum(sizes) == n and min(sizes) >= 1
    exact = [n * w / sum(weights) for w in weights]
    if all(e >= 1 for e in exact):  # no device lifted to one sample: largest remainders hold
        assert all(abs(s - e) < 1 for s, e in zip(sizes, exact))


def test_a_weighted_split_keeps_every_sample_in_order_on_its_device():
    X = np.arange(40).reshape(20, 2)
    y = np.arange(20)
    devices = gm.cpu_devices(3)
    Xs, ys = gm.split_batch(X, y, devices, weights=[1, 2, 1])
    assert [len(s) for s in ys] == [5, 10, 5]
    assert [s.ctx for s in Xs] == devices and [s.ctx for s in ys] == devices
    onp.testing.assert_array_equal(onp.concatenate([s.asnumpy() for s in ys]), onp.arange(20))
    onp.testing.assert_array_equal(onp.concatenate([s.asnumpy() for s in Xs]), X.asnumpy())


def params(net, ctx):
    return [p.data(ctx).asnumpy() for p in net.collect_params().values()]


def test_a_weighted_step_on_two_devices_equals_one_step_on_one_device(fashion_test):
    images, labels = fashion_test
    X = np.array(images[:64, None] / 255.0, dtype='float32')
    y = np.array(labels[:64], dtype='int32')
    out = {}
    for name, devices, weights in (('one', [mx.cpu(0)], None),
                                   ('weighted', gm.cpu_devices(2), [1, 3])):
        mx.random.seed(7)
        net = gm.simple_cnn()
        net.initialize(init.Uniform(0.07), ctx=devices)
        trainer = gm.kvstores.make_trainer(net, 0.3, 'device')
        # the loss is a sum over samples and trainer.step divides by the whole batch
        gm.train_batch(net, X, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices,
                       split_f=functools.partial(gm.split_batch, weights=weights))
        out[name] = params(net, devices[-1])
    for a, b in zip(out['one'], out['weighted']):
        onp.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_evaluation_with_unequal_shards_equals_a_numpy_count(fashion_test):
    images, labels = fashion_test
    devices = gm.cpu_devices(2)
    mx.random.seed(3)
    net = gm.simple_cnn()
    net.initialize(init.Uniform(0.07), ctx=devices)
    X = np.array(images[:100, None] / 255.0, dtype='float32')
    y = labels[:100]
    expected = (net(X.as_in_ctx(devices[0])).asnumpy().argmax(axis=1) == y).mean()
    batches = [(X[i:i + 25], np.array(y[i:i + 25], dtype='int32')) for i in range(0, 100, 25)]
    split = functools.partial(gm.split_batch, weights=[1, 4])
    assert gm.evaluate_accuracy_gpus(net, batches, devices, split) == pytest.approx(expected,
                                                                                   abs=1e-12)


def test_train_and_the_cli_refuse_weights_that_do_not_fit(capsys):
    with pytest.raises(gm.DeviceError, match='3 split weights for 2 devices'):
        gm.train(gm.simple_cnn(), [], [], gm.cpu_devices(2), hooks=[gm.balance.Split([1, 2, 3])])
    with pytest.raises(gm.DeviceError, match='must be positive'):
        gm.train(gm.simple_cnn(), [], [], gm.cpu_devices(2), hooks=[gm.balance.Split([1, 0])])
    train = load_script('train')
    assert train.main(['--cpu-devices', '2', '--split', '1,2,3']) == 2
    assert '--split gives 3 weights for 2 devices' in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        train.main(['--cpu-devices', '2', '--split', '1,x'])
    assert stop.value.code == 2 and 'neither even, auto nor positive weights' in capsys.readouterr().err


def test_the_cli_trains_as_well_with_a_1_3_split_as_with_the_even_one(fashion_dir, tmp_path,
                                                                      capsys):
    """The same data, initial weights and update: the same test accuracy (to rounding).

    16 steps of 128 images: well above chance (0.1), not yet trained out.
    """
    train = load_script('train')
    argv = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1', '--num-train',
            '2048', '--num-test', '512', '--data-dir', str(fashion_dir), '--progress-interval', '0']
    acc = {}
    for split in ('even', '1,3'):
        out = tmp_path / f'{split}.json'
        assert train.main(argv + ['--split', split, '--json', str(out)]) == 0
        acc[split] = json.loads(out.read_text())['runs'][0]['epochs'][0]['test_acc']
    capsys.readouterr()
    assert acc['even'] > 0.25 and abs(acc['even'] - acc['1,3']) <= 2 / 512


def test_the_first_line_gives_the_shards_of_an_uneven_split():
    from gluon_multigpu.runs.train_run import per_device
    assert per_device(None, 128, 2) == '64 per device'
    assert per_device([1.0, 3.0], 128, 2) == '32 + 96 by --split 1,3'
    assert per_device([1.0, 1.0, 2.0], 10, 3) == '3 + 2 + 5 by --split 1,1,2'  # ties: the first device
    assert per_device('auto', 128, 2) == '64 per device at first, then --split auto'
    # a batch that does not divide evenly: the shards split_batch makes, not a fraction
    assert per_device(None, 127, 2) == '64 + 63' and per_device(None, 10, 4) == '3 + 3 + 2 + 2'
    X, y = mx.np.zeros((10, 1)), mx.np.zeros((10,))
    assert [len(s) for s in gm.split_batch(X, y, gm.cpu_devices(4))[1]] == [3, 3, 2, 2]

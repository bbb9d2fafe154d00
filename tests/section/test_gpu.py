"""The same data-parallel step on real GPUs; skipped on machines with fewer than two."""
import numpy as onp
import pytest
from mxnet import init, np

import gluon_multigpu as gm

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gm.num_gpus() < 2, reason='needs at least two GPUs')]


@pytest.mark.parametrize('kvstore', ['local', 'device'])
def test_parameters_agree_on_two_gpus_after_training(kvstore):
    devices = gm.gpu_devices(2)
    rng = onp.random.default_rng(0)
    batches = [(np.array(rng.random((64, 1, 28, 28)), dtype='float32'),
                np.array(rng.integers(0, 10, 64), dtype='int32')) for _ in range(4)]
    net = gm.simple_cnn()
    gm.train(net, batches, batches[:1], devices, num_epochs=1, lr=0.1, kvstore=kvstore, seed=0,
             initializer=init.Uniform(0.07))
    for p in net.collect_params().values():
        onp.testing.assert_array_equal(p.data(devices[0]).asnumpy(), p.data(devices[1]).asnumpy())


def test_float16_trains_on_two_gpus_with_float32_master_weights():
    devices = gm.gpu_devices(2)
    rng = onp.random.default_rng(1)
    X = rng.random((64, 1, 28, 28)).astype('float32')
    y = (X.reshape(64, -1).mean(axis=1) > 0.5).astype('int32')  # a rule the net can learn
    batches = [(np.array(X), np.array(y))] * 30
    net = gm.simple_cnn()
    precision = gm.precision.MixedPrecision('float16')
    result = gm.train(net, batches, batches[:1], devices, num_epochs=2, lr=0.1, seed=0,
                      initializer=init.Uniform(0.07), hooks=[precision])
    assert result.epochs[-1].train_loss < result.epochs[0].train_loss
    assert all(p.data(devices[0]).dtype == onp.float16 for p in net.collect_params().values())
    for p in net.collect_params().values():
        onp.testing.assert_array_equal(p.data(devices[0]).asnumpy(), p.data(devices[1]).asnumpy())


def test_sync_bn_keeps_one_set_of_running_statistics_on_two_gpus():
    devices = gm.gpu_devices(2)
    rng = onp.random.default_rng(2)
    batches = [(np.array(rng.random((32, 1, 28, 28)), dtype='float32'),
                np.array(rng.integers(0, 10, 32), dtype='int32')) for _ in range(3)]
    net = gm.resnet18(10, norm=gm.sync_bn.sync_batch_norm(2))
    gm.train(net, batches, batches[:1], devices, num_epochs=1, lr=0.05, seed=0)
    stats = [p for name, p in net.collect_params().items() if 'running' in name]
    assert stats
    for p in stats:
        onp.testing.assert_array_equal(p.data(devices[0]).asnumpy(), p.data(devices[1]).asnumpy())

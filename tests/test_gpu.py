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

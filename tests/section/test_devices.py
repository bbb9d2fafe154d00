import mxnet as mx
import numpy as onp
import pytest
from mxnet import np

import gluon_multigpu as gm


def test_cpu_devices_lists_contexts_in_order():
    assert gm.cpu_devices(3) == [mx.cpu(0), mx.cpu(1), mx.cpu(2)]


@pytest.mark.parametrize('bad', [0, -1, 1.5, True, '2'])
def test_cpu_devices_rejects_non_positive_counts(bad):
    with pytest.raises(gm.DeviceError):
        gm.cpu_devices(bad)


@pytest.mark.skipif(gm.num_gpus() > 0, reason='checks the behaviour without a GPU')
def test_without_gpu_the_book_helpers_fall_back_to_cpu():
    assert gm.try_gpu() == mx.cpu()
    assert gm.try_gpu(3) == mx.cpu()
    assert gm.try_all_gpus() == [mx.cpu()]


def test_asking_for_more_gpus_than_exist_suggests_cpu_devices():
    n = gm.num_gpus() + 1
    with pytest.raises(gm.DeviceError, match=f'`cpu_devices` {n}'):
        gm.gpu_devices(n)


def test_split_batch_puts_each_shard_on_its_device():
    devices = gm.cpu_devices(2)
    X = np.arange(8 * 3).reshape(8, 3)
    y = np.arange(8)
    X_shards, y_shards = gm.split_batch(X, y, devices)
    assert [s.ctx for s in X_shards] == devices
    assert [s.ctx for s in y_shards] == devices
    assert [s.shape for s in X_shards] == [(4, 3), (4, 3)]
    onp.testing.assert_array_equal(onp.concatenate([s.asnumpy() for s in X_shards]), X.asnumpy())


@pytest.mark.parametrize('n, k', [(7, 2), (10, 4), (5, 3), (3, 3), (257, 2)])
def test_uneven_batches_use_every_sample_exactly_once(n, k):
    devices = gm.cpu_devices(k)
    X = np.arange(n * 2).reshape(n, 2)
    y = np.arange(n)
    X_shards, y_shards = gm.split_batch(X, y, devices)
    sizes = [s.shape[0] for s in X_shards]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    labels = onp.concatenate([s.asnumpy() for s in y_shards])
    onp.testing.assert_array_equal(labels, onp.arange(n))
    for xs, ys in zip(X_shards, y_shards):  # features stay with their labels
        onp.testing.assert_array_equal(xs.asnumpy()[:, 0], ys.asnumpy() * 2)


def test_batch_smaller_than_device_count_is_a_clear_error():
    with pytest.raises(gm.DeviceError, match='cannot be split across 3 devices'):
        gm.split_batch(np.zeros((2, 1)), np.zeros(2), gm.cpu_devices(3))


def test_mismatched_features_and_labels_are_refused():
    with pytest.raises(gm.DeviceError, match='4 samples but labels hold 3'):
        gm.split_batch(np.zeros((4, 1)), np.zeros(3), gm.cpu_devices(2))

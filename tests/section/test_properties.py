"""Properties of splitting a batch and of evaluating over devices, for any batch and device count.

Hypothesis draws batch sizes (1..300), device counts (1..4 CPU contexts) and
ways to cut the evaluation data into batches; the examples are few enough for
the file to run in seconds.
"""
import mxnet as mx
import numpy as onp
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mxnet import np
from mxnet.gluon import nn

import gluon_multigpu as gm

PROPERTY = settings(max_examples=100, deadline=None)


def numbered_batch(n, width, seed, ctx):
    """A batch whose first feature column is the sample's index, with random labels."""
    rng = onp.random.default_rng(seed)
    X = rng.standard_normal((n, width)).astype('float32')
    X[:, 0] = onp.arange(n)
    y = rng.integers(0, 10, size=n).astype('int32')
    return X, y, np.array(X, ctx=ctx), np.array(y, ctx=ctx)


def concat(shards):
    return onp.concatenate([s.asnumpy() for s in shards])


@PROPERTY
@given(n=st.integers(1, 300), k=st.integers(1, 4), width=st.integers(1, 3),
       source=st.integers(0, 4), seed=st.integers(0, 2 ** 32 - 1))
@example(n=4, k=4, width=1, source=0, seed=0)
@example(n=2, k=3, width=1, source=1, seed=0)
@example(n=5, k=4, width=2, source=3, seed=0)
@example(n=300, k=3, width=1, source=0, seed=0)
def test_split_batch_uses_every_sample_once_in_order_on_its_device(n, k, width, source, seed):
    devices = gm.cpu_devices(k)
    X, y, X_mx, y_mx = numbered_batch(n, width, seed, mx.cpu(source))
    if n < k:
        with pytest.raises(gm.DeviceError, match=f'cannot be split across {k} devices'):
            gm.split_batch(X_mx, y_mx, devices)
        return
    X_shards, y_shards = gm.split_batch(X_mx, y_mx, devices)
    assert len(X_shards) == len(y_shards) == k
    assert [s.ctx for s in X_shards] == devices and [s.ctx for s in y_shards] == devices
    sizes = [s.shape[0] for s in X_shards]
    assert [s.shape[0] for s in y_shards] == sizes  # features stay with their labels
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert all(s.shape[1:] == (width,) for s in X_shards)
    onp.testing.assert_array_equal(concat(X_shards), X)
    onp.testing.assert_array_equal(concat(y_shards), y)


@PROPERTY
@given(k=st.integers(2, 4), data=st.data())
def test_a_batch_smaller_than_the_device_count_is_refused_with_advice(k, data):
    n = data.draw(st.integers(1, k - 1), label='n')
    _, _, X, y = numbered_batch(n, 2, 0, mx.cpu())
    with pytest.raises(gm.DeviceError, match=(
            rf'a batch of {n} sample\(s\) cannot be split across {k} devices; '
            rf'use a batch size of at least {k} or fewer devices')):
        gm.split_batch(X, y, gm.cpu_devices(k))


@st.composite
def evaluation_cases(draw):
    """Devices, a cut of the data into batches (maybe a last one smaller than the devices)."""
    k = draw(st.integers(1, 4), label='devices')
    sizes = draw(st.lists(st.integers(1, 60), min_size=1, max_size=6), label='batch sizes')
    if k > 1 and draw(st.booleans(), label='short last batch'):
        sizes.append(draw(st.integers(1, k - 1), label='last batch'))
    classes = draw(st.integers(2, 10), label='classes')
    features = draw(st.integers(1, 6), label='features')
    seed = draw(st.integers(0, 2 ** 32 - 1), label='seed')
    return k, sizes, classes, features, seed


def dense_net(weight, bias, devices):
    """A Dense layer initialised on every device, with the given weights."""
    net = nn.Dense(weight.shape[0], in_units=weight.shape[1])
    net.initialize(ctx=devices)
    net.weight.set_data(np.array(weight))
    net.bias.set_data(np.array(bias))
    return net


@PROPERTY
@given(case=evaluation_cases(), use=st.integers(1, 4))
@example(case=(4, [3], 3, 2, 0), use=4)
@example(case=(4, [9, 2, 1], 10, 3, 1), use=4)
@example(case=(3, [300], 5, 1, 2), use=2)
def test_evaluation_accuracy_equals_a_numpy_count(case, use):
    k, sizes, classes, features, seed = case
    devices = gm.cpu_devices(k)
    rng = onp.random.default_rng(seed)
    # Small integer weights and inputs: the float32 logits are exact, and the
    # bias c/16 breaks every tie, so MXNet and NumPy agree on each argmax.
    weight = rng.integers(-3, 4, size=(classes, features)).astype('float32')
    bias = (onp.arange(classes) / 16).astype('float32')
    n = sum(sizes)
    X = rng.integers(-4, 5, size=(n, features)).astype('float32')
    predicted = (X @ weight.T + bias).argmax(axis=1)
    # Right on a random subset, wrong (some other class) everywhere else.
    right = rng.random(n) < rng.random()
    y = onp.where(right, predicted, (predicted + rng.integers(1, classes, size=n)) % classes)
    expected = int((predicted == y).sum())
    assert expected == int(right.sum())
    ends = onp.cumsum(sizes)
    batches = [(np.array(X[e - s:e]), np.array(y[e - s:e], dtype='int32'))
               for s, e in zip(sizes, ends)]
    net = dense_net(weight, bias, devices)
    assert gm.evaluate_accuracy_gpus(net, batches, devices) == expected / n
    some = devices[:min(use, k)]
    assert gm.evaluate_accuracy_gpus(net, batches, some) == expected / n


def test_evaluation_of_no_data_is_an_error():
    net = dense_net(onp.ones((2, 1), 'float32'), onp.zeros(2, 'float32'), gm.cpu_devices(2))
    with pytest.raises(gm.GluonMultiGPUError, match='evaluation data is empty'):
        gm.evaluate_accuracy_gpus(net, [], gm.cpu_devices(2))

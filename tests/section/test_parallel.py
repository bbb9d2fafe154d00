"""The multi-device semantics of the section, checked on CPU contexts."""
import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, gluon, init, np

import gluon_multigpu as gm


def real_batch(fashion_test, n, start=0):
    images, labels = fashion_test
    X = np.array(images[start:start + n, None] / 255.0, dtype='float32')
    return X, np.array(labels[start:start + n], dtype='int32')


def params_on(net, ctx):
    return [p.data(ctx).asnumpy() for p in net.collect_params().values()]


def trainable(net):
    return [p for p in net.collect_params().values() if p.grad_req != 'null']


def forward_backward(net, X, y, devices):
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    X_shards, y_shards = gm.split_batch(X, y, devices)
    with autograd.record():
        losses = [loss(net(a), b) for a, b in zip(X_shards, y_shards)]
    for l in losses:
        l.backward()


def test_initialize_puts_identical_parameters_on_every_device():
    devices = gm.cpu_devices(3)
    net = gm.book.resnet18(10)
    net.initialize(init.Normal(sigma=0.01), ctx=devices)
    net(np.random.uniform(size=(2, 1, 28, 28), ctx=devices[1]))  # deferred init happens here
    first = params_on(net, devices[0])
    for ctx in devices[1:]:
        for a, b in zip(first, params_on(net, ctx)):
            onp.testing.assert_array_equal(a, b)
    assert all(p.list_ctx() == devices for p in net.collect_params().values())


def test_reading_a_parameter_where_it_was_not_initialised_raises():
    devices = [mx.cpu(1), mx.cpu(2)]
    net = gm.simple_cnn()
    net.initialize(ctx=devices)
    net(np.zeros((1, 1, 28, 28), ctx=devices[0]))
    weight = net[0].params.get('weight')
    with pytest.raises(RuntimeError, match='not initialized on context cpu\\(0\\)'):
        weight.data()  # the default context, cpu(0), is not in the list
    assert weight.data(devices[1]).shape == (20, 1, 3, 3)


@pytest.mark.parametrize('kvstore', ['local', 'device', 'none'])
def test_gradients_differ_per_device_and_parameters_agree_after_the_step(kvstore, fashion_test):
    devices = gm.cpu_devices(2)
    mx.random.seed(1)
    net = gm.simple_cnn()
    net.initialize(init.Uniform(0.07), ctx=devices)
    trainer = gm.kvstores.make_trainer(net, 0.5, kvstore)
    X, y = real_batch(fashion_test, 16)
    forward_backward(net, X, y, devices)
    for p in trainable(net):  # each device saw other samples
        g0, g1 = (p.grad(ctx).asnumpy() for ctx in devices)
        assert not onp.allclose(g0, g1), p.name
    before = params_on(net, devices[0])
    trainer.step(16)
    after = [params_on(net, ctx) for ctx in devices]
    for a, b, old in zip(after[0], after[1], before):
        onp.testing.assert_array_equal(a, b)
        assert not onp.array_equal(a, old)


def one_step(devices, X, y, kvstore='device', seed=7):
    mx.random.seed(seed)
    net = gm.simple_cnn()
    net.initialize(init.Uniform(0.07), ctx=devices)
    trainer = gm.kvstores.make_trainer(net, 0.3, kvstore)
    gm.train_batch(net, X, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
    return params_on(net, devices[-1])


@pytest.mark.parametrize('n', [32, 31])
def test_a_step_on_two_devices_equals_one_step_on_one_device(n, fashion_test):
    # The simple CNN has no BatchNorm, so splitting the batch changes nothing but
    # the order of float additions: tolerances are float32 rounding.
    X, y = real_batch(fashion_test, n)
    single = one_step([mx.cpu(0)], X, y)
    for kvstore in ('local', 'device', 'none'):
        double = one_step(gm.cpu_devices(2), X, y, kvstore)
        for a, b in zip(single, double):
            onp.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def numpy_predictions(net, X, ctx):
    return net(np.array(X, ctx=ctx)).asnumpy().argmax(axis=1)


def test_evaluate_accuracy_gpus_counts_every_sample_once(fashion_test):
    devices = gm.cpu_devices(3)
    mx.random.seed(3)
    net = gm.simple_cnn()
    net.initialize(init.Uniform(0.07), ctx=devices)
    X, y = real_batch(fashion_test, 101)
    # batches of 40, 40, 20 and a last one of 1: uneven shards, and fewer samples than devices
    batches = [(X[i:j], y[i:j]) for i, j in ((0, 40), (40, 80), (80, 100), (100, 101))]
    expected = (numpy_predictions(net, X.asnumpy(), devices[0]) == y.asnumpy()).mean()
    assert 0 < expected < 1  # an untrained net: the count is not trivially 0 or all
    assert gm.evaluate_accuracy_gpus(net, batches, devices) == pytest.approx(expected, abs=1e-12)
    assert gm.evaluate_accuracy_gpus(net, batches, devices[:2]) == \
        pytest.approx(expected, abs=1e-12)


def test_accuracy_counts_argmax_matches():
    y_hat = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    y = np.array([1, 1, 1], dtype='int32')
    assert float(gm.accuracy(y_hat, y)) == 2.0


def test_train_returns_a_complete_result_on_any_iterable(fashion_test):
    batches = [real_batch(fashion_test, 50, start) for start in range(0, 150, 50)]
    seen = []
    result = gm.train(gm.simple_cnn(), batches, batches, gm.cpu_devices(2), num_epochs=2,
                      lr=0.1, kvstore='local', seed=0, initializer=init.Uniform(0.07),
                      on_epoch=seen.append)
    assert [e.epoch for e in result.epochs] == [1, 2] and seen == result.epochs
    assert result.devices == ['cpu(0)', 'cpu(1)'] and result.kvstore == 'local'
    for e in result.epochs:
        assert e.samples == 150 and e.seconds > 0 and 0 <= e.train_acc <= 1
        assert e.train_loss > 0 and 0 <= e.test_acc <= 1
    assert result.final_line() == (f'test acc: {result.test_acc[-1]:.2f}, '
                                   f'{result.sec_per_epoch:.1f} sec/epoch on [cpu(0), cpu(1)]')
    assert result.to_dict()['epochs'][1]['epoch'] == 2


def test_train_loss_is_the_mean_per_sample_loss(fashion_test):
    # With lr tiny, the parameters hardly move, so the epoch's mean loss must equal
    # the loss of the initial network computed independently on one device.
    X, y = real_batch(fashion_test, 60)
    net = gm.simple_cnn()
    result = gm.train(net, [(X[:30], y[:30]), (X[30:], y[30:])], [(X, y)], gm.cpu_devices(2),
                      num_epochs=1, lr=1e-12, seed=11, initializer=init.Uniform(0.07))
    logits = net(X.as_in_ctx(mx.cpu(0))).asnumpy().astype(onp.float64)
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= onp.log(onp.exp(logp).sum(axis=1, keepdims=True))
    expected = -logp[onp.arange(60), y.asnumpy()].mean()
    assert result.epochs[0].train_loss == pytest.approx(expected, rel=1e-5)
    assert result.epochs[0].train_acc == pytest.approx(
        (logits.argmax(axis=1) == y.asnumpy()).mean())


def test_a_diverging_learning_rate_stops_with_a_clear_error(fashion_test):
    batches = [real_batch(fashion_test, 64, start) for start in range(0, 512, 64)]
    with pytest.raises(gm.TrainingDiverged, match=r'the training loss became non-finite at '
                       r'step \d+ in epoch 1; lower the learning'):
        gm.train(gm.simple_cnn(), batches, batches, gm.cpu_devices(2), num_epochs=3, lr=1e4,
                 seed=0, initializer=init.Uniform(0.07))


def test_mxnets_trainer_without_kvstore_lets_the_copies_drift_and_ours_does_not(fashion_test):
    # Why the 'none' baseline needs ReducingTrainer: MXNet's Trainer without a
    # kvstore updates each device's copy with that device's gradient only.
    X, y = real_batch(fashion_test, 16)
    devices = gm.cpu_devices(2)
    for trainer_of, drifts in ((lambda net: gluon.Trainer(net.collect_params(), 'sgd',
                                                          {'learning_rate': 0.5}, kvstore=None),
                                True),
                               (lambda net: gm.kvstores.ReducingTrainer(
                                   net.collect_params(), 'sgd', {'learning_rate': 0.5}), False)):
        mx.random.seed(1)
        net = gm.simple_cnn()
        net.initialize(init.Uniform(0.07), ctx=devices)
        trainer = trainer_of(net)
        forward_backward(net, X, y, devices)
        trainer.step(16)
        same = all(onp.array_equal(a, b)
                   for a, b in zip(params_on(net, devices[0]), params_on(net, devices[1])))
        assert same is not drifts


def test_allreduce_leaves_the_sum_on_every_device():
    parts = [onp.arange(6.0).reshape(2, 3) * (i + 1) for i in range(3)]
    arrays = [np.array(a, ctx=ctx) for a, ctx in zip(parts, gm.cpu_devices(3))]
    gm.kvstores.allreduce(arrays)
    for a, ctx in zip(arrays, gm.cpu_devices(3)):
        assert a.ctx == ctx
        onp.testing.assert_array_equal(a.asnumpy(), sum(parts))


@pytest.mark.parametrize('kwargs, message', [
    ({'kvstore': 'nccl2'}, "unknown kvstore 'nccl2'"),
    ({'kvstore': 'dist_sync2'}, "unknown kvstore 'dist_sync2'; choose one of local, device, nccl"),
    ({'kvstore': 'dist_sync'}, 'pass the kvstore that distributed.connect returns'),
    ({'kvstore': 'nccl'}, 'nccl'),
    ({'lr': -0.1}, 'learning rate must be a positive number'),
    ({'lr': float('nan')}, 'learning rate must be a positive number'),
    ({'num_epochs': 0}, 'number of epochs must be a positive integer'),
])
def test_train_refuses_bad_arguments_before_touching_the_network(kwargs, message):
    net = gm.simple_cnn()
    with pytest.raises(gm.GluonMultiGPUError, match=message):
        gm.train(net, [], [], gm.cpu_devices(2), **kwargs)
    assert all(p._data is None and p._deferred_init == () for p in net.collect_params().values())

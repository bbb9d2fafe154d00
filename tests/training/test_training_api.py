"""The library as a notebook user calls it: the recipes' defaults, runs that go on, plug-ins."""
import numpy as onp
import pytest
from mxnet import gluon, init
from mxnet.gluon import nn

import gluon_multigpu as gm


def small_data(batch=32, steps=6, seed=0):
    train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', batch, num_train=batch * steps,
                                                   num_test=batch, seed=seed, num_devices=2)
    return train_iter, test_iter


def params(net):
    return [p.data(p.list_ctx()[0]).asnumpy().copy() for p in net.collect_params().values()]


def largest_difference(a, b):
    return max(float(onp.abs(x - y).max()) for x, y in zip(a, b))


class Spy(gm.Hook):
    """Records what train set up and, optionally, stops the epoch after step ``stop_at``."""

    def __init__(self, stop_at=None):
        self.stop_at, self.run, self.steps = stop_at, None, []

    def setup(self, run):
        self.run = run

    def step_end(self, run, step, samples, timer):
        self.steps.append((run.epoch, step))
        if self.stop_at is not None and (run.epoch, step) == self.stop_at:
            self.stop_at = None
            return True
        return None


def test_the_natural_call_takes_the_models_recipe(monkeypatch):
    seen = {}
    original = gm.training.train_epoch

    def spy(step, *args, **kwargs):
        seen['max_in_flight'] = step.max_in_flight
        return original(step, *args, **kwargs)

    monkeypatch.setattr(gm.training, 'train_epoch', spy)
    train_iter, test_iter = small_data(batch=64, steps=2)
    result = gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=1)
    assert result.lr == 0.3 and seen['max_in_flight'] == 1  # the CLI's --model simple-cnn
    result = gm.train(gm.resnet18(), train_iter, None, gm.cpu_devices(2), num_epochs=1)
    assert result.lr == pytest.approx(0.1 * 64 / 256)       # lr 0.1 per 256 samples


def test_the_recipe_initialises_the_simple_cnn_with_uniform_weights():
    # Normal(0.01) leaves the small CNN near chance for epochs; the recipe's Uniform(0.07) does not
    train_iter = small_data(steps=1)[0]
    run = gm.Training(gm.simple_cnn(), train_iter, None, gm.cpu_devices(1))
    X, _ = next(iter(train_iter))
    run.net(X)  # the shapes are known at the first forward pass: initialised then
    weights = [p.data(p.list_ctx()[0]).asnumpy() for n, p in run.net.collect_params().items()
               if n.endswith('weight')]
    assert max(float(onp.abs(w).max()) for w in weights) <= 0.07
    assert min(float(w.std()) for w in weights) > 0.03  # Uniform(0.07): 0.04; Normal(0.01): 0.01


def test_a_network_of_your_own_gets_the_books_settings():
    net = nn.Sequential()
    net.add(nn.Flatten(), nn.Dense(10))
    train_iter, test_iter = small_data(steps=2)
    result = gm.train(net, train_iter, test_iter, gm.cpu_devices(2), num_epochs=1)
    assert result.lr == 0.1
    assert gm.recipe_of(net) is gm.recipes.BOOK
    weight = net.collect_params()[next(iter(net.collect_params()))].data(gm.cpu_devices(2)[0])
    assert float(weight.asnumpy().std()) < 0.02  # Normal(0.01)


def test_fit_goes_on_without_reinitialising():
    devices = gm.cpu_devices(2)
    train_iter, test_iter = small_data()
    once = gm.simple_cnn()
    gm.train(once, train_iter, test_iter, devices, num_epochs=2)
    train_iter.epoch = 0
    run = gm.Training(gm.simple_cnn(), train_iter, test_iter, devices)
    run.fit(1)
    result = run.fit(1)
    assert [r.epoch for r in result.epochs] == [1, 2] and run.epoch == 2
    assert result is run.result and result.training is run
    train_iter.epoch = 1  # what a re-initialised second fit would train on
    again = gm.Training(gm.simple_cnn(), train_iter, test_iter, devices, seed=1)
    again.fit(1)
    same, other = (largest_difference(params(run.net), params(once)),
                   largest_difference(params(run.net), params(again.net)))
    assert same < other / 100, (same, other)


def test_an_interrupted_epoch_finishes_from_where_it_stopped():
    devices = gm.cpu_devices(2)
    train_iter, test_iter = small_data(steps=6)
    whole = gm.simple_cnn()
    gm.train(whole, train_iter, test_iter, devices, num_epochs=2)
    train_iter.epoch = 0
    spy = Spy(stop_at=(1, 4))
    with pytest.raises(gm.Interrupted) as stopped:
        gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=2, hooks=[spy])
    error = stopped.value
    assert (error.epoch, error.batches, error.epoch_done) == (1, 4, False)
    assert error.training is gm.last_run() and 'gm.last_run().fit()' in str(error)
    result = error.training.fit()  # what that fit was asked for: the rest of epoch 1, then 2
    assert [r.epoch for r in result.epochs] == [1, 2]
    assert result.epochs[0].samples == 6 * 32  # the stop lost no step and repeated none
    assert spy.steps == [(1, s) for s in range(1, 7)] + [(2, s) for s in range(1, 7)]
    assert largest_difference(params(error.training.net), params(whole)) < 1e-4


def test_any_iterable_goes_on_after_an_interrupt():
    devices = gm.cpu_devices(2)
    train_iter, _ = small_data(steps=5)
    batches = [(X, y) for X, y in train_iter]  # a plain list
    spy = Spy(stop_at=(1, 2))
    run = gm.Training(gm.simple_cnn(), batches, None, devices, hooks=[spy])
    with pytest.raises(gm.Interrupted):
        run.fit(1)
    result = run.fit()
    assert result.epochs[0].samples == 5 * 32 and len(spy.steps) == 5


def test_fit_with_nothing_left_says_what_to_give():
    run = gm.Training(gm.simple_cnn(), small_data(steps=1)[0], None, gm.cpu_devices(1))
    with pytest.raises(gm.GluonMultiGPUError, match='give `num_epochs`'):
        run.fit()
    run.fit(1)
    with pytest.raises(gm.GluonMultiGPUError, match='nothing left to continue'):
        run.fit()
    with pytest.raises(gm.GluonMultiGPUError, match='positive integer'):
        run.fit(0)


def test_two_plug_ins_for_the_same_part_of_the_step_are_refused():
    with pytest.raises(gm.GluonMultiGPUError, match='two hooks set the split'):
        gm.train(gm.simple_cnn(), small_data(steps=1)[0], None, gm.cpu_devices(2),
                 num_epochs=1, hooks=[gm.balance.Split(), gm.balance.Split([1, 2])])


def test_features_plug_in_without_parameters_of_train():
    import inspect
    # (train_epoch and train_batch take `pushers`: how a step is queued, not a feature)
    # (train: 13 and ``options``, the keyword arguments of Training that add what users of
    # training tools ask for: accumulation, clipping, schedules, metrics, a profile, a watch)
    for function, most in ((gm.train, 14), (gm.train_epoch, 14), (gm.train_batch, 12)):
        assert len(inspect.signature(function).parameters) <= most, function
    assert not {'split', 'precision', 'step_scale'} & set(inspect.signature(gm.train).parameters)
    split = gm.balance.Split([1, 3])
    spy = Spy()
    result = gm.train(gm.simple_cnn(), small_data(steps=2)[0], None, gm.cpu_devices(2),
                      num_epochs=1, hooks=[split, spy])
    assert spy.run.split is split and spy.run.eval_split is not None
    assert result.epochs[0].samples == 64


def test_a_gluon_dataloader_trains_like_the_packages_loader():
    images = onp.random.default_rng(0).integers(0, 255, (96, 28, 28, 1)).astype('uint8')
    labels = onp.random.default_rng(1).integers(0, 10, 96).astype('int32')
    dataset = gluon.data.ArrayDataset(images.astype('float32').transpose(0, 3, 1, 2) / 255,
                                      labels)
    loader = gluon.data.DataLoader(dataset, batch_size=32)
    net = nn.HybridSequential()
    net.add(nn.Dense(10))
    result = gm.train(net, loader, loader, gm.cpu_devices(2), num_epochs=2,
                      initializer=init.Xavier())
    assert [r.samples for r in result.epochs] == [96, 96]
    assert result.lr == 0.1  # no recipe, no batch_size attribute: the book's lr

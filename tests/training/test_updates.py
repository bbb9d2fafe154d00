"""Updates other than the book's: accumulated batches, clipping by the global norm, schedules.

Each against an independent computation: one large batch for the accumulated
small ones, NumPy for the norm and the clipped step, the closed forms for the
rates (and the optimizer's own rate at every update), an uninterrupted run
for a stopped and resumed one.
"""
import math
import sys

import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, gluon, np

import gluon_multigpu as gm
from gluon_multigpu.machinery.updates import Schedule
from conftest import REPO, load_script, run_bounded

K, B = 3, 8


def small_net():
    """A network without BatchNorm whose shapes are known before a batch (no deferred init)."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, activation='relu', in_channels=1), gluon.nn.Flatten(),
            gluon.nn.Dense(10, in_units=4 * 6 * 6))
    return net


def batches(n, size=B, seed=0):
    rng = onp.random.RandomState(seed)
    X = rng.rand(n * size, 1, 8, 8).astype('float32')
    y = rng.randint(0, 10, n * size).astype('float32')
    return [(np.array(X[i * size:(i + 1) * size]), np.array(y[i * size:(i + 1) * size]))
            for i in range(n)]


def weights(net, device=mx.cpu(0)):
    return [p.data(device).asnumpy() for p in net.collect_params().values()]


def trained(data, devices, kvstore, epochs=1, **options):
    net = small_net()
    result = gm.Training(net, data, None, devices, lr=0.5, kvstore=kvstore,
                         **options).fit(epochs)
    return net, result


def farthest(a, b):
    return max(float(onp.abs(x - y).max()) for x, y in zip(a, b))


@pytest.mark.parametrize('devices', [1, 2])
@pytest.mark.parametrize('kvstore', ['local', 'device', 'none'])
def test_k_batches_accumulated_are_one_batch_k_times_as_large(devices, kvstore):
    contexts = [mx.cpu(i) for i in range(devices)]
    small = batches(2 * K)  # two updates of K batches each
    large = [(np.concatenate([x for x, _ in small[i:i + K]]),
              np.concatenate([y for _, y in small[i:i + K]])) for i in (0, K)]
    a, result = trained(small, contexts, kvstore, accumulate=K)
    b, _ = trained(large, contexts, kvstore)
    assert farthest(weights(a), weights(b)) < 1e-6
    assert result.epochs[0].rates == [0.5, 0.5]  # two updates of six batches
    one, _ = trained(small, contexts, kvstore)  # an update after each batch: another result
    assert farthest(weights(one), weights(b)) > 1e-3
    if devices == 2:
        assert farthest(weights(a), weights(a, mx.cpu(1))) == 0


def test_an_epochs_last_shorter_group_is_an_update_of_its_own_samples():
    small = batches(K + 1)  # a group of K, then one of 1 batch
    large = [(np.concatenate([x for x, _ in small[:K]]), np.concatenate([y for _, y in small[:K]])),
             small[K]]
    a, result = trained(small, [mx.cpu(0), mx.cpu(1)], 'device', accumulate=K)
    b, _ = trained(large, [mx.cpu(0), mx.cpu(1)], 'device')
    assert farthest(weights(a), weights(b)) < 1e-6 and len(result.epochs[0].rates) == 2


def numpy_step(net, X, y, lr, clip, samples):
    """The clipped SGD step of ``net`` on one batch, computed on one device and in NumPy:
    ``(new weights, norm)``."""
    ref = small_net()
    ref.initialize(ctx=mx.cpu(0))
    for p, q in zip(ref.collect_params().values(), net.collect_params().values()):
        p.set_data(q.data(mx.cpu(0)))
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(ref(X), y)
    loss.backward()
    grads = [p.grad(mx.cpu(0)).asnumpy().astype('float64') / samples
             for p in ref.collect_params().values()]
    norm = math.sqrt(sum((g ** 2).sum() for g in grads))
    factor = min(1.0, clip / norm)
    return [w - lr * factor * g for w, g in zip(weights(net), grads)], norm


@pytest.mark.parametrize('kvstore', ['local', 'device', 'none'])
@pytest.mark.parametrize('clip', [0.05, 100.0])
def test_clipping_uses_the_global_norm_of_the_summed_gradient(kvstore, clip):
    (X, y), = batches(1, size=16)
    net = small_net()
    run = gm.Training(net, [(X, y)], None, [mx.cpu(0), mx.cpu(1)], lr=0.5, kvstore=kvstore,
                      clip_grad_norm=clip)
    expected, norm = numpy_step(net, X, y, 0.5, clip, 16)
    result = run.fit(1)
    assert result.epochs[0].grad_norms == pytest.approx([norm], rel=1e-5)
    assert norm > 0.05  # the small bound clips, the large one does not
    assert farthest(weights(net), expected) < 1e-6
    assert farthest(weights(net), weights(net, mx.cpu(1))) == 0


def test_the_norm_of_accumulated_batches_is_the_large_batchs():
    small = batches(K)
    large = [(np.concatenate([x for x, _ in small]), np.concatenate([y for _, y in small]))]
    _, a = trained(small, [mx.cpu(0), mx.cpu(1)], 'device', accumulate=K, clip_grad_norm=0.1)
    _, b = trained(large, [mx.cpu(0)], 'device', clip_grad_norm=0.1)
    assert a.epochs[0].grad_norms == pytest.approx(b.epochs[0].grad_norms, rel=1e-5)


def closed_form(name, lr, k, total, warmup):
    t = k - 1
    if name == 'onecycle':
        ramp = warmup or total // 3
        if t < ramp:
            return lr / 25 + (lr - lr / 25) * t / ramp
        return lr / 1e4 + (lr - lr / 1e4) * (1 + onp.cos(onp.pi * (t - ramp) / (total - ramp))) / 2
    if t < warmup:
        return lr * (t + 1) / warmup
    p = (t - warmup) / (total - warmup)
    return {'constant': lr, 'cosine': lr * (1 + onp.cos(onp.pi * p)) / 2,
            'step': lr * (1 if p < 0.5 else 0.1 if p < 0.75 else 0.01)}[name]


@pytest.mark.parametrize('name', ['constant', 'step', 'cosine', 'onecycle'])
@pytest.mark.parametrize('warmup', [0, 7])
def test_each_schedule_gives_its_closed_form(name, warmup):
    schedule = Schedule(name, 0.4, warmup, 100)
    rates = [schedule.rate(k) for k in range(1, 101)]
    assert rates == pytest.approx([closed_form(name, 0.4, k, 100, warmup)
                                   for k in range(1, 101)], rel=1e-9)
    assert max(rates) == pytest.approx(0.4)


class RateSeen(gm.Hook):
    """The optimizer's rate after each update (MXNet's own count and scheduler)."""

    def __init__(self):
        self.seen = []

    def step_end(self, run, step, samples, timer):
        opt = run.trainer._optimizer
        self.seen.append(opt.lr_scheduler(opt.num_update) if opt.lr_scheduler else opt.lr)


@pytest.mark.parametrize('kvstore', ['device', 'local', 'none'])
def test_the_rates_recorded_are_the_optimizers(kvstore):
    seen = RateSeen()
    _, result = trained(batches(5), [mx.cpu(0), mx.cpu(1)], kvstore, epochs=3, hooks=[seen],
                        lr_schedule='cosine', warmup_steps=2)
    rates = [r for e in result.epochs for r in e.rates]
    assert len(rates) == 15 and seen.seen == pytest.approx(rates, rel=1e-12)
    assert rates == pytest.approx([closed_form('cosine', 0.5, k, 15, 2) for k in range(1, 16)])


class StopAt(gm.Hook):
    """Asks the run to stop after step ``step`` of epoch ``epoch``."""

    def __init__(self, epoch, step):
        self.epoch, self.step, self.asked = epoch, step, None

    def step_end(self, run, step, samples, timer):
        if (run.epoch, step) == (self.epoch, self.step) or self.asked is not None:
            self.asked = self.asked or step
            return True
        return False


OPTIONS = dict(accumulate=3, clip_grad_norm=0.3, lr_schedule='onecycle', warmup_steps=2)


def test_a_stop_inside_a_group_waits_for_its_update_and_resumes_exactly(fashion_dir, tmp_path):
    train, test = gm.load_data('fashion-mnist', 64, root=str(fashion_dir), num_train=1280,
                               num_test=200)
    devices = [mx.cpu(0), mx.cpu(1)]

    def run(hooks, epochs=2):
        net = gm.simple_cnn()
        result = gm.Training(net, train, test, devices, lr=0.3, hooks=hooks, **OPTIONS).fit(epochs)
        return net, result
    whole, whole_result = run([])
    ckpt = tmp_path / 'ckpt'
    stop = StopAt(2, 4)  # step 4 of 20: inside the second group of three
    with pytest.raises(gm.Interrupted) as stopped:
        run([stop, gm.Checkpointer(ckpt, {'run': 1})])
    assert stopped.value.batches == 6  # the group of steps 4 to 6 was updated first
    resumed, result = run([gm.Checkpointer(ckpt, {'run': 1}, resume=True)])
    assert farthest(weights(resumed), weights(whole)) < 1e-6
    # The stopped epoch's norms before the stop come back from the checkpoint with the rest.
    for mine, whole_epoch in zip(result.epochs, whole_result.epochs):
        assert len(mine.grad_norms) == len(whole_epoch.grad_norms) == 7
        assert mine.grad_norms == pytest.approx(whole_epoch.grad_norms, rel=1e-5)
        assert mine.rates == pytest.approx(whole_epoch.rates, rel=1e-12)


def test_bad_values_are_refused_in_one_line(fashion_dir):
    data = batches(2)
    for options, phrase in (({'accumulate': 0}, '`accumulate` must be a whole number 1 to'),
                            ({'accumulate': 2.5}, '`accumulate` must be a whole number'),
                            ({'clip_grad_norm': -1}, '`clip_grad_norm` must be a positive'),
                            ({'clip_grad_norm': float('nan')}, '`clip_grad_norm` must be'),
                            ({'lr_schedule': 'linear'}, "`lr_schedule` 'linear' is not one of"),
                            ({'warmup_steps': -3}, '`warmup_steps` must be a whole number')):
        with pytest.raises(gm.GluonMultiGPUError, match=phrase):
            gm.Training(small_net(), data, None, [mx.cpu(0)], **options)


def test_a_warm_up_as_long_as_the_run_is_one_warning_that_names_the_numbers():
    schedule = Schedule('cosine', 0.3, warmup=20, total=20)
    assert gm.updates.warmup_warning(schedule, 2, 10, accumulate=4) == (
        '`warmup_steps` 20 is the whole run: it makes 20 updates (2 epoch(s) of 10, an update '
        'every 4 batches), all of them warm-up: the cosine schedule never starts; give '
        '`warmup_steps` below 20, or more `num_epochs`')
    assert gm.updates.warmup_warning(Schedule('cosine', 0.3, 19, 20), 2, 10) is None
    with pytest.warns(gm.SettingWarning, match=r'^`warmup_steps` 9 is the whole run: it makes 6 '
                      r'updates \(2 epoch\(s\) of 3, an update every 2 batches\), all of them '
                      r'warm-up; give'):
        trained(batches(6), [mx.cpu(0)], 'device', epochs=2, accumulate=2, warmup_steps=9)


def test_the_command_line_says_a_warm_up_as_long_as_the_run_in_one_line(tmp_path):
    # 256 images, batch 128: 2 batches an epoch, 1 update of 4; 2 epochs: 2 updates
    done = run_bounded([sys.executable, str(REPO / 'scripts' / 'train.py'), '--cpu-devices', '1',
                        '--model', 'simple-cnn', '--synthetic', '--num-train', '256',
                        '--num-test', '64', '--num-epochs', '2', '--accumulate', '4',
                        '--lr-schedule', 'cosine', '--warmup-steps', '20',
                        '--progress-interval', '0'], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        'warning: --warmup-steps 20 is the whole run: it makes 2 updates (2 epoch(s) of 1, an '
        'update every 4 batches), all of them warm-up: the cosine schedule never starts; give '
        '--warmup-steps below 2, or more --num-epochs'], done.stderr


@pytest.mark.parametrize('flags, phrase', [
    (['--accumulate', '0'], 'argument --accumulate: 0 is not positive'),
    (['--clip-grad-norm', '0'], 'argument --clip-grad-norm: 0 is not a positive finite number'),
    (['--lr-schedule', 'exp'], "argument --lr-schedule: invalid choice: 'exp'"),
    (['--book-literal', '--accumulate', '2'], "--book-literal runs the text's update after"),
    (['--kvstore', 'dist_sync', '--clip-grad-norm', '1'], '--clip-grad-norm needs the summed'),
])
def test_the_command_line_refuses_what_cannot_go(fashion_dir, flags, phrase, capsys):
    try:
        status = load_script('train').main(['--cpu-devices', '2', '--model', 'simple-cnn',
                                            '--data-dir', str(fashion_dir), *flags])
    except SystemExit as e:  # the parser's refusal
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count('\n') == 1 and phrase in err, err

"""Mixed precision: float16 for GPUs (refused on CPU contexts) and dynamic loss scaling
(bfloat16: test_bfloat16.py)."""
import mxnet as mx
import numpy as onp
import pytest
from mxnet import gluon, npx

import gluon_multigpu as gm
from gluon_multigpu.features.precision import LossScaler, MixedPrecision, check_dtype, make_precision
from conftest import load_script


def test_float16_is_refused_on_cpu_contexts_and_accepted_for_gpus(tmp_path, capsys):
    with pytest.raises(gm.DeviceError, match='FP16 gemm on cpu not implemented'):
        gm.train(gm.simple_cnn(), [], [], gm.cpu_devices(2),
                 hooks=[gm.precision.MixedPrecision('float16')])
    check_dtype('float16', [mx.gpu(0), mx.gpu(1)])  # a Context is a name: no GPU is touched
    with pytest.raises(gm.GluonMultiGPUError, match='unknown dtype'):
        make_precision('float64', gm.cpu_devices(1))
    train = load_script('train')
    out = tmp_path / 'runs.json'
    assert train.main(['--cpu-devices', '2', '--dtype', 'float16', '--synthetic',
                       '--json', str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('error: --dtype float16 needs GPUs')
    assert not out.exists()


def test_float16_casts_the_network_and_reaches_the_trainer(monkeypatch):
    """What train sets up for float16 GPUs, run on a CPU context up to the first float16 product."""
    seen = {}
    make_trainer = gm.kvstores.make_trainer

    def trainer_spy(net, lr, kvstore, multi_precision=False):
        seen['trainer'] = make_trainer(net, lr, kvstore, multi_precision)
        return seen['trainer']

    monkeypatch.setattr(gm.precision, 'check_dtype', lambda *args: None)  # as on GPUs
    monkeypatch.setattr(gm.training, 'make_trainer', trainer_spy)
    data, _ = gm.data.synthetic_data('fashion-mnist', 8, num_train=16, num_test=8, seed=0)
    net = gm.resnet18(10)
    with pytest.raises(mx.base.MXNetError, match='FP16 gemm on cpu not implemented'):
        gm.train(net, data, None, [mx.cpu()], num_epochs=1,
                 hooks=[gm.precision.MixedPrecision('float16')])
    try:
        npx.waitall()  # clear what else the engine holds of that error
    except mx.base.MXNetError:
        pass
    assert seen['trainer']._optimizer.multi_precision  # pylint: disable=protected-access
    dtypes = {name: onp.dtype(p.dtype) for name, p in net.collect_params().items()}
    convs = [n for n in dtypes if 'conv' in n or 'dense' in n]
    norms = [n for n in dtypes if 'batchnorm' in n]
    assert convs and all(dtypes[n] == onp.float16 for n in convs)
    assert norms and all(dtypes[n] == onp.float32 for n in norms)  # BatchNorm stays float32


def test_loss_scaling_changes_nothing_but_skips_overflowing_steps():
    data, _ = gm.data.synthetic_data('fashion-mnist', 64, num_train=640, num_test=64, seed=2,
                                     num_devices=2)
    result = {}
    for name, precision in (('plain', None),
                            ('scaled', MixedPrecision('float32', LossScaler(2.0 ** 10, window=3)))):
        net = gm.simple_cnn()
        data.epoch = 0
        gm.train(net, data, None, gm.cpu_devices(2), num_epochs=1, lr=0.1, seed=1,
                 initializer=gm.default_initializer('simple-cnn'),
                 hooks=[precision] if precision else [])
        result[name] = [p.data(mx.cpu(1)).asnumpy() for p in net.collect_params().values()]
    # A power of two scales and unscales exactly: the same parameters, bit for bit.
    assert all(onp.array_equal(a, b) for a, b in zip(result['plain'], result['scaled']))
    assert precision.scaler.scale == 2.0 ** 13 and precision.scaler.skipped == 0  # 10 quiet steps

    devices = gm.cpu_devices(2)
    net = gm.simple_cnn()
    net.initialize(ctx=devices)
    scaler = LossScaler(2.0 ** 10)
    MixedPrecision('float32', scaler).prepare(net)
    trainer = gm.kvstores.make_trainer(net, 0.1, 'device')
    X, y = next(iter(data))

    def backward():
        gm.train_batch(net, X, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices,
                       after_backward=overflow, scaler=scaler)

    def overflow(net, devices):
        scaler.params[2].grad(devices[1])[:] = onp.inf  # one device's gradient overflows

    backward()  # the first step: it must be skipped
    assert scaler.scale == 2.0 ** 9 and scaler.skipped == 1
    before = [p.data(devices[0]).asnumpy() for p in scaler.params]
    backward()
    assert all(onp.array_equal(a, p.data(devices[0]).asnumpy())
               for a, p in zip(before, scaler.params))
    assert scaler.scale == 2.0 ** 8 and scaler.skipped == 2
    overflow = lambda net, devices: None  # noqa: E731  (gradients as computed: finite)
    backward()
    assert scaler.skipped == 2 and not onp.array_equal(before[0],
                                                       scaler.params[0].data(devices[0]).asnumpy())

"""bfloat16 on CPU contexts (issue 54): the converted graph trains, evaluates, checkpoints, resumes.

Every test but the refusal's needs a CPU with bfloat16 kernels (AVX-512): elsewhere it is
skipped, saying why (``check_bfloat16``'s line).
"""
import os
import re
import sys

import mxnet as mx
import numpy as onp
import pytest

import gluon_multigpu as gm
from gluon_multigpu.features import precision
from gluon_multigpu.features.precision import Bfloat16, MixedPrecision, check_dtype, make_precision
from checkpoint_files import figures, manifest, saved_params
from conftest import REPO, load_script, run_bounded

#: Batches of each epoch, and their size (16 a context).
STEPS, BATCH = 3, 32


@pytest.fixture
def bfloat16():
    try:
        precision.check_bfloat16()
    except gm.DeviceError as e:
        pytest.skip(str(e))


def data(fashion_dir):
    return gm.load_data_fashion_mnist(BATCH, root=str(fashion_dir), num_train=BATCH * STEPS,
                                      num_test=64)


def training(fashion_dir, model, dtype, kvstore='device', hooks=()):
    train_iter, test_iter = data(fashion_dir)
    hooks = [*hooks] + ([MixedPrecision(dtype)] if dtype != 'float32' else [])
    return gm.Training(gm.get_model(model), train_iter, test_iter, gm.cpu_devices(2),
                       kvstore=kvstore, seed=1, progress_interval=0, hooks=hooks)


def trained(net):
    return [k for k, p in net.collect_params().items() if p.grad_req != 'null']


def params_of(net, device):
    return {k: p.data(device).asnumpy() for k, p in net.collect_params().items()}


def test_bfloat16_is_refused_where_the_cpu_has_no_kernels_and_on_gpus(monkeypatch, tmp_path,
                                                                      capsys):
    monkeypatch.setattr(precision, '_bfloat16_failure',
                        lambda: 'could not create a primitive descriptor iterator')
    with pytest.raises(gm.DeviceError) as e:
        make_precision('bfloat16', gm.cpu_devices(1))
    assert '\n' not in str(e.value)
    assert 'cannot compute in bfloat16' in str(e.value) and 'primitive descriptor' in str(e.value)
    out = tmp_path / 'runs.json'
    assert load_script('train').main(['--cpu-devices', '2', '--dtype', 'bfloat16', '--synthetic',
                                      '--json', str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'cannot compute in bfloat16' in err, err
    assert not out.exists()
    with pytest.raises(gm.DeviceError, match=r'bfloat16 needs CPU contexts, and gpu\(0\) is a GPU'):
        check_dtype('bfloat16', [mx.gpu(0), mx.gpu(1)])  # a Context is a name: no GPU is touched


@pytest.mark.slow
def test_train_refuses_bfloat16_where_onednn_has_no_kernel_in_one_line(tmp_path):
    """Not mocked: oneDNN held to AVX2 (as many AMD EPYCs) has no bfloat16 convolution."""
    env = dict(os.environ, DNNL_MAX_CPU_ISA='AVX2', ONEDNN_MAX_CPU_ISA='AVX2')
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'train.py'), '--cpu-devices', '2',
                        '--dtype', 'bfloat16', '--synthetic', '--num-epochs', '1'], env=env)
    # MXNet's own log lines ("[07:17:02] ../src/operator/...") go to stderr too
    err = [l for l in proc.stderr.splitlines() if not re.match(r'\[\d\d:\d\d:\d\d\] ', l)]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith('error: this CPU cannot compute in bfloat16') and \
        'could not create a primitive descriptor' in err[0], err


@pytest.mark.slow
@pytest.mark.parametrize('model', ['simple-cnn', 'resnet18'])
def test_the_converted_network_trains_and_tracks_float32(bfloat16, fashion_dir, model):
    """Two epochs of 3 batches on two contexts, at the recipe's rate: the losses follow float32's.

    bfloat16 keeps 8 significant bits (each value within 2**-9, 0.2%, of itself) and oneDNN
    sums the products in float32. Measured here: the epochs' losses 1e-4 (simple CNN) and
    1.5e-3 (ResNet-18, at 4x the rate) from float32's; 0.01 (0.4% of a loss near 2.3) leaves
    room for other CPUs' kernels, while a step gone astray (a wrong cast) moves it further.
    Not equal: the network did compute in bfloat16.
    """
    runs = {dtype: training(fashion_dir, model, dtype) for dtype in ('float32', 'bfloat16')}
    results = {dtype: run.fit(2) for dtype, run in runs.items()}
    losses = {d: [e.train_loss for e in r.epochs] for d, r in results.items()}
    assert losses['bfloat16'] != losses['float32']
    assert onp.allclose(losses['bfloat16'], losses['float32'], rtol=0, atol=0.01), losses
    accs = [e.test_acc for e in results['bfloat16'].epochs]
    assert all(0 <= a <= 1 for a in accs)
    model_ = runs['bfloat16'].run.model  # the block trained and evaluated: the converted graph
    assert isinstance(model_, Bfloat16) and model_.converted is not None
    graph = model_.converted._cached_graph[1]  # pylint: disable=protected-access
    # (its tojson() leaves the bfloat16 casts out; its internals list them)
    assert any('amp_cast_bfloat16' in name for name in graph.get_internals().list_outputs())
    # The parameters (master weights) stay float32, the trained ones the same on both contexts
    # (BatchNorm's running statistics are each context's own, as in float32).
    net = runs['bfloat16'].net
    a, b = params_of(net, mx.cpu(0)), params_of(net, mx.cpu(1))
    assert all(v.dtype == onp.float32 for v in a.values())
    assert all(onp.array_equal(a[k], b[k]) for k in trained(net))


@pytest.mark.slow
def test_a_checkpoint_holds_float32_and_resumes_as_the_uninterrupted_run(bfloat16, fashion_dir,
                                                                         tmp_path):
    whole = training(fashion_dir, 'resnet18', 'bfloat16',
                     hooks=[gm.Checkpointer(tmp_path / 'whole', {'run': 'bf16'})])
    whole.fit(2)
    first = training(fashion_dir, 'resnet18', 'bfloat16',
                     hooks=[gm.Checkpointer(tmp_path / 'cut', {'run': 'bf16'})])
    first.fit(1)
    saved = saved_params(tmp_path / 'cut')
    assert saved and all(v.dtype == onp.float32 for v in saved.values())
    resumed = training(fashion_dir, 'resnet18', 'bfloat16',
                       hooks=[gm.Checkpointer(tmp_path / 'cut', {'run': 'bf16'}, resume=True)])
    result = resumed.fit(2)
    assert [e.epoch for e in result.epochs] == [1, 2]
    assert figures(manifest(tmp_path / 'cut')['history']) == \
        figures(manifest(tmp_path / 'whole')['history'])
    a, b = saved_params(tmp_path / 'whole'), saved_params(tmp_path / 'cut')
    assert sorted(a) == sorted(b)
    assert all(onp.array_equal(a[k], b[k]) for k in a if 'running_' not in k)  # the weights
    # BatchNorm's running statistics: within float32 rounding, as a float32 ResNet-18's resume
    # (measured: up to 1.2e-7 apart in float32 and in bfloat16 alike, the weights equal)
    for k in (k for k in a if 'running_' in k):
        onp.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize('kvstore', ['local', 'device', 'none'])
def test_every_kvstore_trains_in_bfloat16(bfloat16, fashion_dir, kvstore):
    run = training(fashion_dir, 'simple-cnn', 'bfloat16', kvstore=kvstore)
    losses = [e.train_loss for e in run.fit(2).epochs]
    assert all(onp.isfinite(losses)) and losses[1] < losses[0], losses
    a, b = params_of(run.net, mx.cpu(0)), params_of(run.net, mx.cpu(1))
    assert all(onp.array_equal(a[k], b[k]) for k in trained(run.net))  # every context's update


def test_a_network_of_plain_blocks_is_one_line(bfloat16):
    """The text's ResNet-18 (``nn.Block`` residuals) has no graph to convert."""
    data, _ = gm.data.synthetic_data('fashion-mnist', 16, num_train=32, num_test=16, seed=0,
                                     num_devices=2)
    with pytest.raises(gm.GluonMultiGPUError, match='Residual is not a HybridBlock') as e:
        gm.train(gm.book.resnet18(10), data, None, gm.cpu_devices(2), num_epochs=1,
                 progress_interval=0, hooks=[MixedPrecision('bfloat16')])
    assert '\n' not in str(e.value)

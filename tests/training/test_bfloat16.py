"""bfloat16 on CPU contexts (issue 54): the converted graph trains, evaluates, checkpoints, resumes.

Every test but the refusal's needs a CPU with bfloat16 kernels (AVX-512): elsewhere it is
skipped, saying why (``check_bfloat16``'s line).
"""
import json
import os
import statistics
import sys
import warnings

import mxnet as mx
import numpy as onp
import pytest

import gluon_multigpu as gm
from gluon_multigpu.features import precision
from gluon_multigpu.features.precision import Bfloat16, MixedPrecision, check_dtype, make_precision
from checkpoint_files import figures, manifest, saved_params
from conftest import REPO, load_script, load_tool, run_bounded

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


def test_the_cpu_feature_bfloat16_lacks_or_uses_is_named():
    assert precision.cpu_bfloat16({'sse2', 'avx2'}, {}) == \
        (False, 'the CPU lacks AVX-512: no avx512f among its /proc/cpuinfo flags')
    assert precision.cpu_bfloat16({'avx512f'}, {}) == (False, 'the CPU lacks avx512_bf16')
    assert precision.cpu_bfloat16({'avx512f', 'avx512_bf16'}, {}) == \
        (True, 'the CPU lists avx512f and avx512_bf16')
    assert precision.cpu_bfloat16({'avx512f', 'amx_bf16'}, {})[0]
    held = precision.cpu_bfloat16({'avx512f', 'avx512_bf16'}, {'DNNL_MAX_CPU_ISA': 'AVX2'})
    assert not held[0] and 'held to AVX2 (DNNL_MAX_CPU_ISA)' in held[1]
    assert precision.cpu_bfloat16(set(), {}) == (False, "the system does not list the CPU's "
                                                        'features')


def test_the_speedups_the_doctor_expects_are_the_recorded_measurements():
    rows = json.loads((REPO / 'docs' / 'results' / 'bfloat16-train.json').read_text())
    assert {r['model'] for r in rows} == set(precision.SPEEDUP)
    for r in rows:  # each kvstore's median of the rounds' paired ratios, to one decimal
        assert abs(precision.SPEEDUP[r['model']] - r['median_ratio']) < 0.1, r
        assert r['median_ratio'] == statistics.median(r['ratios'])
        assert r['ratios'] == [b / f for f, b in zip(r['float32'], r['bfloat16'])]


@pytest.mark.parametrize('outlook, line', [
    ({'trains': False, 'cpu': 'the CPU lacks AVX-512', 'speedup': None},
     'no (the CPU lacks AVX-512): --dtype bfloat16 is refused here'),
    ({'trains': True, 'cpu': 'the CPU lacks avx512_bf16', 'speedup': None},
     'emulated (the CPU lacks avx512_bf16): --dtype bfloat16 trains, expect it no faster than '
     'float32'),
    ({'trains': True, 'cpu': 'the CPU lists avx512f and avx512_bf16',
      'speedup': {'resnet18': 1.94, 'simple-cnn': 1.2}},
     'yes (the CPU lists avx512f and avx512_bf16): --dtype bfloat16 is expected to train '
     'resnet18 about 1.9x, simple-cnn about 1.2x as fast as float32')])
def test_the_doctor_says_whether_bfloat16_trains_and_how_fast(outlook, line):
    from gluon_multigpu import doctor
    assert doctor._bfloat16_line(outlook) == line


def test_bfloat16_emulated_without_its_instructions_is_a_warning(monkeypatch):
    monkeypatch.setattr(precision, '_bfloat16_failure', lambda: '')  # kernels: as if present
    monkeypatch.setattr(precision.machine, 'cpu_flags', lambda: frozenset({'avx512f'}))

    class Run:  # what ``setup`` reads and calls
        devices, net, trainer_options = gm.cpu_devices(1), gm.get_model('simple-cnn'), {}
        plugged = {}

        def plug(self, name, value, owner):
            self.plugged[name] = value
    with pytest.warns(gm.SettingWarning, match='without bfloat16 instructions .the CPU lacks '
                      'avx512_bf16.: oneDNN emulates them, expect no speed-up'):
        MixedPrecision('bfloat16').setup(Run())
    assert isinstance(Run.plugged['model'], Bfloat16)
    monkeypatch.setattr(precision.machine, 'cpu_flags',
                        lambda: frozenset({'avx512f', 'avx512_bf16'}))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        MixedPrecision('bfloat16').setup(Run())


@pytest.mark.slow
def test_train_refuses_bfloat16_where_onednn_has_no_kernel_in_one_line(tmp_path):
    """Not mocked: oneDNN held to AVX2 (as many AMD EPYCs) has no bfloat16 convolution."""
    env = dict(os.environ, DNNL_MAX_CPU_ISA='AVX2', ONEDNN_MAX_CPU_ISA='AVX2')
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'train.py'), '--cpu-devices', '2',
                        '--dtype', 'bfloat16', '--synthetic', '--num-epochs', '1'], env=env)
    err = proc.stderr.splitlines()  # MXNet's own log line of the failure silenced
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0].startswith('error: this CPU cannot compute in bfloat16') and \
        'could not create a primitive descriptor' in err[0], err
    assert precision.cpu_bfloat16(environ=env)[1] in err[0]  # what the CPU lacks, or the limit
    assert err[0].endswith(': train in --dtype float32 here')


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


@pytest.mark.slow
def test_synchronised_batchnorm_synchronises_in_bfloat16(bfloat16, fashion_dir):
    """--sync-bn with --dtype bfloat16: the converted graph's SyncBatchNorm layers still share
    their statistics (tests/sync_bn_probe.py, every run in bfloat16, the 1-device one too).

    Measured here (AMD EPYC, AVX512_BF16): the running statistics 2.9e-4 from one device's
    (of 0.93; bfloat16 keeps 2**-9 of a value) against 5.9e-3 for plain BatchNorm, equal on both
    devices; the update 0.47 of the largest from one device's, plain BatchNorm's 1.84.
    """
    env = {k: v for k, v in os.environ.items() if k not in ('MXNET_CPU_TEMP_COPY', 'OMP_NUM_THREADS')}
    done = run_bounded([sys.executable, str(REPO / 'tests' / 'sync_bn_probe.py'), str(fashion_dir),
                        '--dtype', 'bfloat16'], timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    sync, plain = result['sync'], result['plain']
    assert sync['num_sync_layers'] == 17 and sync['stats_between_devices'] == 0.0
    assert sync['stats_vs_one_device'] < 2 ** -7 * sync['stats_max']  # a few bfloat16 roundings
    assert plain['stats_vs_one_device'] > 3 * sync['stats_vs_one_device']
    assert plain['stats_between_devices'] > 1e-3
    assert sync['update_vs_one_device'] < 0.5 * plain['update_vs_one_device']


def test_a_network_of_plain_blocks_is_one_line(bfloat16):
    """The text's ResNet-18 (``nn.Block`` residuals) has no graph to convert."""
    data, _ = gm.data.synthetic_data('fashion-mnist', 16, num_train=32, num_test=16, seed=0,
                                     num_devices=2)
    with pytest.raises(gm.GluonMultiGPUError, match='Residual is not a HybridBlock') as e:
        gm.train(gm.book.resnet18(10), data, None, gm.cpu_devices(2), num_epochs=1,
                 progress_interval=0, hooks=[MixedPrecision('bfloat16')])
    assert '\n' not in str(e.value)


def test_the_accuracy_tool_sets_each_epoch_of_bfloat16_beside_float32(monkeypatch, tmp_path):
    """The tool's bookkeeping, its runs replaced (on a CPU with bfloat16 kernels the next test
    runs them); each gap recomputed from the epochs."""
    tool = load_tool('bfloat16_accuracy')
    monkeypatch.setattr(precision, 'check_bfloat16', lambda: None)
    accs = {('resnet18', 'float32'): [0.85, 0.88, 0.90],
            ('resnet18', 'bfloat16'): [0.86, 0.87, 0.93], ('simple-cnn', 'float32'): [0.81, 0.85],
            ('simple-cnn', 'bfloat16'): [0.815, 0.845]}
    ran = []

    def train(flags, dtype, data_dir, extra):
        ran.append((flags[1], dtype))
        # ResNet-18 from the tool's rate (given: --lr), along the cosine; the main job as it is
        assert (flags[-2:] == ['--lr', '0.01'] and '--lr-schedule' in flags
                if flags[1] == 'resnet18' else '--lr' not in flags)
        return [{'epoch': i + 1, 'test_acc': a} for i, a in enumerate(accs[flags[1], dtype])]
    monkeypatch.setattr(tool, 'train', train)
    out = tmp_path / 'acc.json'
    assert tool.main(['--out', str(out), '--lr', '0.01']) == 1  # ResNet-18's 3rd epoch: 0.03 apart
    assert ran == [('resnet18', 'float32'), ('resnet18', 'bfloat16'), ('simple-cnn', 'float32'),
                   ('simple-cnn', 'bfloat16')]
    written = json.loads(out.read_text())
    for r in written['records']:
        f32, b16 = accs[r['job'], 'float32'], accs[r['job'], 'bfloat16']
        assert r['gaps'] == pytest.approx([abs(a - b) for a, b in zip(f32, b16)])
        assert r['within'] == (max(abs(a - b) for a, b in zip(f32, b16)) <= r['bound'])
    assert [r['within'] for r in written['records']] == [False, True]
    assert written['machine'] and written['date'] and len(written['commit']) >= 40
    assert written['resnet18_lr'] == 0.01


@pytest.mark.slow
def test_the_accuracy_tool_trains_both_or_refuses_in_one_line(tmp_path, fashion_dir):
    proc = run_bounded([sys.executable, str(REPO / 'tools' / 'bfloat16_accuracy.py'), '--jobs',
                        'simple-cnn', '--num-train', '256', '--data-dir', str(fashion_dir),
                        '--out', str(tmp_path / 'acc.json')])
    try:
        precision.check_bfloat16()
    except gm.DeviceError:  # no kernels here: told before the float32 run, nothing written
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith('error: this CPU cannot compute in bfloat16') and \
            '--dtype float32' in proc.stderr and not (tmp_path / 'acc.json').exists()
        return
    assert proc.returncode in (0, 1), proc.stderr
    record, = json.loads((tmp_path / 'acc.json').read_text())['records']
    assert len(record['float32']) == len(record['bfloat16']) == 2
    assert record['float32'] != record['bfloat16']  # two computations, not one run twice


def test_a_bfloat16_probe_that_raises_is_the_doctors_line_not_a_failed_load(monkeypatch):
    import io
    from gluon_multigpu import doctor

    def broken():
        raise TypeError('unexpected')
    monkeypatch.setattr(precision, 'bfloat16_outlook', broken)
    out = io.StringIO()
    doctor.probe(out)
    found = json.loads(next(l for l in out.getvalue().splitlines()
                            if l.startswith(doctor.MARK))[len(doctor.MARK):])
    assert found['loads'] and found['step']['ok']
    assert doctor._bfloat16_line(found['bfloat16']) == \
        'no (TypeError: unexpected): --dtype bfloat16 is refused here'

"""scripts/benchmark.py: the bookkeeping of its table, and quick runs end to end (no timings)."""
import importlib
import json
import subprocess
import sys
import time

import pytest

import gluon_multigpu as gm
from gluon_multigpu.features import precision

from conftest import REPO, load_script, run_bounded

pytestmark = pytest.mark.slow  # subprocesses or real training: the full suite's

BATCH = 128  # the target batch of the synthetic results


@pytest.fixture(scope='module')
def bench():
    return load_script('benchmark')


def train(model, devices, variant, **figures):
    return {f'train/{model}/{devices}/device/{BATCH}/{variant}': [figures]}


def fake_results():
    def ips(*values):
        return [{'images_per_sec': v} for v in values]

    def speed(steady, short, peak, count):
        return {'images_per_sec': steady, 'short_images_per_sec': short, 'peak_mb': peak,
                'param_count': count}
    return {
        'train/resnet18/2/device/128/book': ips(20.0, 30.0, 25.0),
        'train/resnet18/2/device/128/ours': [speed(50.0, 30.0, 900.0, 2**20),
                                             speed(40.0, 20.0, 1000.0, 2**20),
                                             speed(45.0, 25.0, 950.0, 2**20)],
        'train/resnet18/1/device/128/ours': ips(50.0),
        'train/resnet18/2/device/512/ours': ips(44.0),
        'pytorch/resnet18/128': [speed(45.0, 20.0, 500.0, 2**20 - 10)],
        'train/simple-cnn/2/device/128/ours': [speed(3000.0, 1000.0, 200.0, 2**18)],
        'pytorch/simple-cnn/128': [speed(4000.0, 500.0, 300.0, 2**18)],
        'gemm/1': [{'gflops': 100.0}], 'gemm/2': [{'gflops': 200.0}],
        'train/resnet18/2/device/128/ours/bfloat16': [speed(90.0, 40.0, 1000.0, 2**20),
                                                      speed(80.0, 30.0, 1100.0, 2**20),
                                                      speed(85.0, 35.0, 1050.0, 2**20)],
        'pytorch/resnet18/128/bfloat16': [speed(100.0, 25.0, 800.0, 2**20 - 10)],
        'gemm/bfloat16': [{'gflops': 400.0}],
        'pipeline/book': ips(1000.0), 'pipeline/ours': ips(30000.0),
        'e2e/book': [{'epoch_seconds': [10.0, 12.0], 'test_acc': 0.80}],
        'e2e/ours': [{'epoch_seconds': [4.0, 6.0], 'test_acc': 0.795}],
        'memory/book': [{'growth': 0.01, 'peak_mb': 300.0}],
        'memory/ours': [{'growth': 0.08, 'peak_mb': 310.0}, {'error': 'exit 1: boom'}],
    }


def test_an_aim_beyond_the_noise_is_sure_and_one_inside_it_is_not(bench):
    """Round by round: ours/book 2.0, 2.05, 2.02 (aim >= 1.8: met, interval above it); the
    pipeline 19, 22, 21 times the book's (aim >= 20: met by the median, 20 inside the interval).
    The intervals against NumPy: the t-interval of the log ratios' mean, t(0.975, 2) = 4.303."""
    import numpy as onp
    results = fake_results()
    results['train/resnet18/2/device/128/book'] = [{'images_per_sec': 10.0}] * 3
    results['train/resnet18/2/device/128/ours'] = [
        dict(r, images_per_sec=v) for r, v in zip(results['train/resnet18/2/device/128/ours'],
                                                  (20.0, 20.5, 20.2))]
    results['pipeline/book'] = [{'images_per_sec': 1000.0}] * 3
    results['pipeline/ours'] = [{'images_per_sec': v} for v in (19000.0, 22000.0, 21000.0)]
    rows = {r['key']: r for r in bench.summarize(results, flops_per_image=2e9)}

    def interval(ratios):
        logs = onp.log(ratios)
        half = 4.303 * logs.std(ddof=1) / onp.sqrt(len(logs))
        return onp.exp(logs.mean() - half), onp.exp(logs.mean() + half)
    speedup, pipeline = rows['resnet_speedup'], rows['pipeline']
    assert (speedup['low'], speedup['high']) == pytest.approx(interval([2.0, 2.05, 2.02]))
    assert speedup['met'] and speedup['sure'] and speedup['low'] > 1.8
    assert (pipeline['low'], pipeline['high']) == pytest.approx(interval([19.0, 22.0, 21.0]))
    assert pipeline['met'] and pipeline['sure'] is False
    assert rows['e2e_time']['low'] is None and rows['e2e_time']['sure'] is None  # made once
    table = bench.table(list(rows.values()))
    assert '| data pipeline images/s, ours / book-style DataLoader | 1,000 | 21,000 | 21 (' in \
        table and '| >= 20 | yes (inside the noise) |' in table


def test_every_row_is_computed_from_its_figures(bench):
    rows = {r['key']: r for r in bench.summarize(fake_results(), flops_per_image=2e9)}
    assert list(rows) == [t[0] for t in bench.TARGETS]

    def row(key):
        r = rows[key]
        return r['reference'], r['ours'], r['measured'], r['met']
    assert row('resnet_vs_pytorch_short') == pytest.approx((20.0, 25.0, 1.25, True))
    assert row('resnet_vs_pytorch') == pytest.approx((45.0, 45.0, 1.0, False))  # aim 1.2
    assert row('book_batch') == pytest.approx((45.0, 44.0, 44.0 / 45.0, False))
    assert row('resnet_speedup') == pytest.approx((25.0, 45.0, 1.8, True))  # medians; 1.8 >= 1.8
    assert row('two_vs_one') == pytest.approx((50.0, 45.0, 0.9, False))
    assert row('flop_efficiency') == pytest.approx((200.0, 90.0, 0.45, False))
    assert row('cnn_vs_pytorch_short') == pytest.approx((500.0, 1000.0, 2.0, True))
    assert row('cnn_vs_pytorch') == pytest.approx((4000.0, 3000.0, 0.75, False))
    # peak MiB against PyTorch's on the same run (aim: at most 1.2 times)
    assert row('resnet_memory') == pytest.approx((500.0, 950.0, 950.0 / 500.0, False))
    assert row('cnn_memory') == pytest.approx((300.0, 200.0, 200.0 / 300.0, True))
    assert row('pipeline') == pytest.approx((1000.0, 30000.0, 30.0, True))
    # bfloat16: ours against our float32 of the same rounds, and against PyTorch's autocast
    assert row('bf16_speedup') == pytest.approx((45.0, 85.0, 85.0 / 45.0, True))
    assert row('bf16_speedup_short') == pytest.approx((25.0, 35.0, 1.4, False))  # aim 1.5
    assert row('bf16_vs_pytorch') == pytest.approx((100.0, 85.0, 0.85, False))
    assert row('bf16_vs_pytorch_short') == pytest.approx((25.0, 35.0, 1.4, True))
    assert row('bf16_memory') == pytest.approx((800.0, 1050.0, 1050.0 / 800.0, False))
    assert row('bf16_flop_efficiency') == pytest.approx((400.0, 170.0, 170.0 / 400.0, False))
    assert rows['bf16_speedup']['low'] == pytest.approx(min(90 / 50, 80 / 40, 85 / 45), rel=0.5)
    assert row('e2e_time') == pytest.approx((11.0, 5.0, 5.0 / 11.0, True))
    assert row('e2e_accuracy') == pytest.approx((0.80, 0.795, 0.5, True))
    assert row('memory_growth') == pytest.approx((0.01, 0.08, 0.08, False))
    table = bench.table(list(rows.values()))
    assert table.count('\n') == len(rows) + 1 and '| NO |' in table and '| yes |' in table
    assert table.splitlines()[0] == '| aim | reference | ours | measured | aim | met |'
    assert ('| ResNet-18 steady-state images/s, ours / book (2 contexts) | 25 | 45 | 1.8 (') in \
        table  # three rounds of each: the interval of the paired ratios beside the median's


def test_the_memory_aim_is_ours_over_pytorchs_peak(bench):
    results = {**train('simple-cnn', 2, 'ours', peak_mb=120.0),
               f'pytorch/simple-cnn/{BATCH}': [{'peak_mb': 100.0, 'param_count': 2**18}]}
    row = {r['key']: r for r in bench.summarize(results, 1e9)}['cnn_memory']
    assert (row['reference'], row['measured'], row['met']) == (100.0, 1.2, True)


def results_giving(key, value):
    """Synthetic results whose row ``key`` measures ``value``: every figure a row reads."""
    base = 100.0
    if key in ('resnet_vs_pytorch', 'resnet_vs_pytorch_short', 'cnn_vs_pytorch',
               'cnn_vs_pytorch_short'):
        model = 'resnet18' if key.startswith('resnet') else 'simple-cnn'
        field = 'short_images_per_sec' if key.endswith('short') else 'images_per_sec'
        return {**train(model, 2, 'ours', **{field: value * base}),
                f'pytorch/{model}/{BATCH}': [{field: base}]}
    if key == 'resnet_speedup':
        return {**train('resnet18', 2, 'ours', images_per_sec=value * base),
                **train('resnet18', 2, 'book', images_per_sec=base)}
    if key == 'two_vs_one':
        return {**train('resnet18', 2, 'ours', images_per_sec=value * base),
                **train('resnet18', 1, 'ours', images_per_sec=base)}
    if key == 'flop_efficiency':  # 1 GFLOP an image: GFLOP/s = images/s
        return {**train('resnet18', 2, 'ours', images_per_sec=value * base),
                'gemm/1': [{'gflops': base / 2}], 'gemm/2': [{'gflops': base}]}
    if key in ('resnet_memory', 'cnn_memory'):
        model = 'resnet18' if key.startswith('resnet') else 'simple-cnn'
        return {**train(model, 2, 'ours', peak_mb=value * base, param_count=2**18),
                f'pytorch/{model}/{BATCH}': [{'peak_mb': base}]}
    bf16 = f'train/resnet18/2/device/{BATCH}/ours/bfloat16'
    if key.startswith('bf16_') and key != 'bf16_flop_efficiency':
        field = {'bf16_memory': 'peak_mb', 'bf16_speedup_short': 'short_images_per_sec',
                 'bf16_vs_pytorch_short': 'short_images_per_sec'}.get(key, 'images_per_sec')
        reference = (train('resnet18', 2, 'ours', **{field: base}) if 'speedup' in key else
                     {f'pytorch/resnet18/{BATCH}/bfloat16': [{field: base}]})
        return {bf16: [{field: value * base}], **reference}
    if key == 'bf16_flop_efficiency':  # against PyTorch's bfloat16 matrix multiply
        return {bf16: [{'images_per_sec': value * base}], 'gemm/bfloat16': [{'gflops': base}]}
    if key == 'book_batch':
        return {**train('resnet18', 2, 'ours', images_per_sec=base),
                'train/resnet18/2/device/512/ours': [{'images_per_sec': value * base}]}
    if key == 'pipeline':
        return {'pipeline/ours': [{'images_per_sec': value * base}],
                'pipeline/book': [{'images_per_sec': base}]}
    if key == 'e2e_time':
        return {'e2e/ours': [{'epoch_seconds': [value * base], 'test_acc': 0.5}],
                'e2e/book': [{'epoch_seconds': [base], 'test_acc': 0.5}]}
    if key == 'e2e_accuracy':
        return {'e2e/ours': [{'epoch_seconds': [1.0], 'test_acc': 0.5 + value / 100}],
                'e2e/book': [{'epoch_seconds': [1.0], 'test_acc': 0.5}]}
    assert key == 'memory_growth', key
    return {'memory/ours': [{'growth': value}]}


@pytest.mark.parametrize('key, op, threshold', [(k, op, t) for k, _, op, t in
                                                 load_script('benchmark').TARGETS])
def test_each_aim_is_judged_on_both_sides_of_its_threshold(bench, key, op, threshold):
    better, worse = (1.01, 0.99) if op == '>=' else (0.99, 1.01)
    for value, met in ((threshold * better, True), (threshold * worse, False)):
        rows = {r['key']: r for r in bench.summarize(results_giving(key, value), 1e9)}
        assert rows[key]['measured'] == pytest.approx(value)
        assert rows[key]['met'] is met, (key, value)
        assert rows[key]['target'] == f'{op} {threshold:g}'
        # every other row lacks its figures (the two end-to-end rows share theirs)
        assert all(r['met'] is None for k, r in rows.items()
                   if k != key and not (k + key).count('e2e') == 2), key


def test_missing_figures_are_not_applicable_rather_than_met(bench):
    rows = bench.summarize({'pipeline/ours': [{'images_per_sec': 5.0}],
                            f'pytorch/resnet18/{BATCH}': [{'error': 'no PyTorch',
                                                           'torch_missing': True}]}, 1e9)
    assert all(r['met'] is None for r in rows)
    lines = bench.table(rows, no_torch=True).splitlines()
    assert lines[-1].startswith('PyTorch is not installed') and 'n/a' in lines[-1]
    assert lines[-1].endswith("pip install -e '.[bench]'")
    assert '| n/a | n/a | n/a |' in lines[2]
    assert 'PyTorch is not installed' not in bench.table(rows)


def test_bfloat16_is_measured_beside_float32_where_the_cpu_has_it(bench):
    keys = [k for k, _ in bench.plan(bench.FULL, '/data')]
    bf16 = ['train/resnet18/2/device/128/ours/bfloat16', 'pytorch/resnet18/128/bfloat16',
            'gemm/bfloat16']
    assert all(k in keys for k in bf16)
    # in the same round as float32's four, right after them
    assert keys.index(bf16[0]) == keys.index('train/resnet18/1/device/128/ours') + 1
    specs = dict(bench.plan(bench.FULL, '/data'))
    assert specs[bf16[0]]['dtype'] == specs[bf16[1]]['dtype'] == 'bfloat16'
    assert specs[bf16[0]]['steps'] == specs['train/resnet18/2/device/128/ours']['steps']
    without = [k for k, _ in bench.plan(bench.FULL, '/data', bfloat16=False)]
    assert not [k for k in without if 'bfloat16' in k] and len(without) == len(keys) - 3


def test_pytorch_computes_in_bfloat16_under_autocast(fashion_dir):
    pytest.importorskip('torch', reason="PyTorch is the '.[bench]' extra")
    workers = importlib.import_module('lab.commands.bench_workers')
    spec = {'model': 'simple-cnn', 'batch': 8, 'warmup': 1, 'steps': 1,
            'data_dir': str(fashion_dir)}
    assert workers.torch_throughput(spec)['computed'] == ['float32']
    bf16 = workers.torch_throughput(dict(spec, dtype='bfloat16'))
    assert bf16['computed'] == ['bfloat16'] and bf16['images_per_sec'] > 0
    assert workers.torch_gemm({'n': 64, 'reps': 2})['gflops'] > 0


def test_the_pytorch_process_says_when_pytorch_is_missing(monkeypatch):
    workers = importlib.import_module('lab.commands.bench_workers')
    monkeypatch.setitem(sys.modules, 'torch', None)  # ``import torch`` fails
    result = workers.torch_throughput({'model': 'simple-cnn', 'batch': 8, 'warmup': 1,
                                       'steps': 1, 'data_dir': '/nowhere'})
    assert result['torch_missing'] and ".[bench]" in result['error']
    assert workers.torch_gemm({'n': 8, 'reps': 1})['torch_missing']


def test_a_run_without_pytorch_shows_its_rows_as_not_applicable(bench, fashion_dir, tmp_path,
                                                                monkeypatch, capsys):
    def no_torch(spec):
        if spec['kind'] == 'torch_throughput':
            return {'error': 'PyTorch is not installed', 'torch_missing': True}
        return {'images_per_sec': 10.0, 'short_images_per_sec': 5.0, 'peak_mb': 100.0,
                'param_count': 1000}
    monkeypatch.setattr(bench, 'run_task', no_torch)
    monkeypatch.setattr(bench, 'flops_per_image', lambda: 1e9)
    bench.main(['--quick', '--repeats', '1', '--only', 'train/simple-cnn', 'pytorch/simple-cnn',
                '--data-dir', str(fashion_dir), '--json', str(tmp_path / 'b.json')])
    out = capsys.readouterr().out
    assert ("| small CNN steady-state images/s, ours (2 contexts) / PyTorch CPU | n/a | 10 | "
            "n/a | >= 1 | n/a |") in out
    assert "install it with pip install -e '.[bench]'" in out
    assert json.loads((tmp_path / 'b.json').read_text())['pytorch_missing'] is True


def test_the_plan_alternates_the_four_at_the_target_batch_in_every_round(bench):
    assert (bench.FULL['warmup'], bench.FULL['steps']) == (2, 10)  # 2 epochs of 6 batches
    keys = [k for k, _ in bench.plan(bench.FULL, '/data')]
    for model in ('resnet18', 'simple-cnn'):
        four = [f'train/{model}/2/device/128/book', f'train/{model}/2/device/128/ours',
                f'pytorch/{model}/128', f'train/{model}/1/device/128/ours']
        start = keys.index(four[0])
        assert keys[start:start + 4] == four
    specs = dict(bench.plan(bench.FULL, '/data'))
    assert specs['pytorch/simple-cnn/128'] == {
        'kind': 'torch_throughput', 'variant': 'pytorch', 'model': 'simple-cnn', 'batch': 128,
        'steps': 100, 'warmup': 10, 'data_dir': '/data'}  # the small CNN's: 40 times shorter
    assert specs['train/simple-cnn/2/device/128/ours']['steps'] == 100
    assert specs['train/resnet18/2/device/128/ours']['steps'] == 10
    for kept in ('train/resnet18/2/device/32/ours', 'train/resnet18/2/local/128/ours',
                 'train/simple-cnn/2/device/512/book', 'gemm/2', 'pipeline/ours',
                 'eval/resnet18/2/book', 'memory/ours', 'e2e/book'):
        assert kept in specs


def test_the_pytorch_networks_have_the_packages_parameters():
    import gluon_multigpu as gm
    from mxnet import np
    nn = pytest.importorskip('torch.nn', reason="PyTorch is the '.[bench]' extra")
    workers = importlib.import_module('lab.commands.bench_workers')
    for model, gluon_net in (('simple-cnn', gm.simple_cnn(10)), ('resnet18', gm.resnet18(10))):
        gluon_net.initialize()
        gluon_net(np.zeros((1, 1, 28, 28)))  # the shapes are known after a first batch
        ours = [p.data().shape for p in gluon_net.collect_params().values()]
        torch_net = workers.TORCH_MODELS[model](nn)
        weights = [tuple(p.shape) for p in torch_net.parameters()]
        # MXNet counts BatchNorm's running mean and variance among the parameters
        running = [tuple(b.shape) for n, b in torch_net.named_buffers()
                   if not n.endswith('num_batches_tracked')]
        assert sum(map(int, map(onp_prod, ours))) == sum(map(onp_prod, weights + running))
        if model == 'simple-cnn':  # layer by layer, the same shapes
            assert ours == weights and not running
            assert sum(p.numel() for p in torch_net.parameters()) == 129068


def onp_prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_quick_run_with_pytorch_prints_its_rows(fashion_dir, tmp_path):
    pytest.importorskip('torch', reason="PyTorch is the '.[bench]' extra")
    out = tmp_path / 'bench.json'
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'benchmark.py'), '--quick',
                        '--repeats', '1', '--only', 'pytorch/simple-cnn',
                        'train/simple-cnn/2/device/16/ours', '--data-dir', str(fashion_dir),
                        '--json', str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    torch_run, = report['measurements']['pytorch/simple-cnn/16']
    ours_run, = report['measurements']['train/simple-cnn/2/device/16/ours']
    for run in (torch_run, ours_run):
        assert run['images_per_sec'] > 0 and run['short_images_per_sec'] > 0
        assert run['startup_s'] > 0 and run['peak_mb'] > 0 and run['param_count'] == 129068
    rows = {r['key']: r for r in report['targets']}
    for key in ('cnn_vs_pytorch', 'cnn_vs_pytorch_short', 'cnn_memory'):
        assert rows[key]['measured'] > 0 and rows[key]['met'] in (True, False)
        assert f"| {rows[key]['what']} | " in proc.stdout
    assert rows['resnet_vs_pytorch']['met'] is None and report['pytorch_missing'] is False
    try:  # a CPU without bfloat16 kernels: its rows are n/a, saying why (here and in the file)
        precision.check_bfloat16()
        assert report['bfloat16_missing'] is None
    except gm.DeviceError as e:
        said = e.describe(gm.errors.flag)  # train.py's flags, as the programs say them
        assert report['bfloat16_missing'] == said and \
            f'The bfloat16 rows are n/a: {said}' in proc.stdout
    assert '| pytorch/simple-cnn/16 | images_per_sec ' in proc.stdout


def test_quick_run_end_to_end_writes_every_target(fashion_dir, tmp_path):
    out = tmp_path / 'bench.json'
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'benchmark.py'), '--quick',
                           '--repeats', '1', '--only', 'pipeline', 'e2e', 'memory/ours',
                           '--data-dir', str(fashion_dir), '--json', str(out)],
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [r['key'] for r in report['targets']] == [t[0] for t in load_script('benchmark').TARGETS]
    measured = {r['key']: r['measured'] for r in report['targets']}
    assert measured['pipeline'] > 0 and measured['e2e_time'] > 0
    assert measured['memory_growth'] is not None
    assert all('error' not in r for runs in report['measurements'].values() for r in runs)
    assert report['flops_per_image'] == pytest.approx(2.7348e9, rel=1e-3)
    assert report['machine'] == gm.machine.stamp()['machine'] and report['date']  # docs cite it
    assert '| data pipeline images/s, ours / book-style DataLoader |' in proc.stdout


def test_bad_data_dir_is_one_line_and_status_2(tmp_path):
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'benchmark.py'),
                           '--data-dir', str(tmp_path)])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert 'point --data-dir' in proc.stderr


def test_the_short_run_is_timed_from_the_process_launch_as_a_users_run(bench, monkeypatch):
    """A user's run pays for starting Python, importing MXNet or PyTorch and building the
    network: the short run's clock starts when the parent launches the measurement process."""
    workers = importlib.import_module('lab.commands.bench_workers')
    launched = time.time() - 2.0  # a process started two seconds ago

    def step(n):
        return lambda: time.sleep(0.01) or n
    figures = workers._clocked(step(8), step(8), step(16), lambda: None, 32, launched,
                               launched + 1.5)
    assert figures['startup_s'] >= 2.0 and figures['short_images_per_sec'] <= 32 / 2.0
    assert figures['ready_s'] == pytest.approx(1.5) and figures['total_s'] >= 2.03
    assert figures['images_per_sec'] > 32 / 2.0  # the steady state: the measured steps alone
    seen = []

    def fake_run(argv, **kwargs):
        seen.append(json.loads(argv[-1]))
        return subprocess.CompletedProcess(argv, 0, 'RESULT {"images_per_sec": 1.0}\n', '')
    monkeypatch.setattr(bench.subprocess, 'run', fake_run)
    before = time.time()
    assert bench.run_task({'kind': 'throughput'}) == {'images_per_sec': 1.0}
    assert before <= seen[0]['launched'] <= time.time()
    assert workers.launched_at(seen[0]) == seen[0]['launched']

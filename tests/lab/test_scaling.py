"""scripts/scaling.py: a sweep on CPU contexts, its figures recomputed from its files, bad input.

By default a sweep measures each configuration's speed over a few steps (``fixed_global``);
``--full`` trains each to the end and measures its accuracy (``per_device`` and the others).
"""
import io
import math
import os
import re

import matplotlib.image
import numpy as onp
import pytest

import gluon_multigpu as gm
from lab.studies import scaling_report as lab_scaling_report
from lab.studies import scaling_model as scaling
from lab.studies import counts as lab_counts
from lab.studies.csvfiles import read_csv
from gluon_multigpu.base.machine import stamp
from lab.commands import scaling as scaling_cli
from conftest import load_script


# nccl on CPU contexts: refused for the build (no NCCL) or, with NCCL, for the devices
NCCL_ON_CPU = ('sums gradients between GPUs' if gm.kvstores.has_nccl()
               else 'needs an MXNet build with NCCL')

NUM_TRAIN = 256
KVSTORES = ['local', 'device']
RULES = ['linear', 'fixed']
BASE_LR = 0.05
FILES = ['accuracy.png', 'efficiency.png', 'projection.csv', 'report.md', 'scaling.csv',
         'speedup.png', 'sync.csv']
#: Timed steps of the speed sweeps here.
STEPS = 3


@pytest.fixture(scope='module')
def script():
    return load_script('scaling')


def sweep(script, out, *extra):
    """Run the script in this process; return the printed text and the files it wrote."""
    args = script.build_parser().parse_args([
        '--model', 'simple-cnn', '--num-epochs', '1', '--num-train', str(NUM_TRAIN),
        '--num-test', '64', '--base-lr', str(BASE_LR), '--compute-repeats', '1',
        '--sync-repeats', '2', '--progress-interval', '0', '--out', str(out), *extra])
    printed = io.StringIO()
    script.run(args, out=printed)
    return {'printed': printed.getvalue(), 'dir': out,
            'rows': read_csv(out / 'scaling.csv'),
            'projection': read_csv(out / 'projection.csv'),
            'sync': read_csv(out / 'sync.csv'),
            'report': (out / 'report.md').read_text()}


@pytest.fixture(scope='module')
def per_device(script, fashion_dir, tmp_path_factory):
    """Counts 1 and 2, 32 samples per device, two lr rules, two kvstores, projected to 8: each
    configuration trained to the end (--full)."""
    return sweep(script, tmp_path_factory.mktemp('sweep') / 'out', '--full', '--cpu-devices', '2',
                 '--batch-per-device', '32', '--lr-rule', *RULES, '--kvstores', *KVSTORES,
                 '--project-to', '8', '--data-dir', str(fashion_dir))


@pytest.fixture(scope='module')
def fixed_global(script, fashion_dir, tmp_path_factory):
    """Counts 1, 2 and 3 sharing a global batch of 64 (strong scaling), projected to 4: the
    default, each configuration's speed over STEPS steps."""
    return sweep(script, tmp_path_factory.mktemp('global') / 'out', '--steps', str(STEPS),
                 '--cpu-devices', '3',
                 '--global-batch', '64', '--lr-rule', 'sqrt', '--kvstores', 'device',
                 '--project-to', '4', '--data-dir', str(fashion_dir))


def expected_lr(rule, batch):
    return {'linear': BASE_LR * batch / 256, 'fixed': BASE_LR,
            'sqrt': BASE_LR * (batch / 256) ** 0.5}[rule]


def test_every_requested_configuration_has_a_row(per_device):
    assert sorted(os.listdir(per_device['dir'])) == sorted(FILES + ['results.json'])
    wanted = sorted((n, kv, 32 * n, 32, rule) for n in (1, 2) for kv in KVSTORES for rule in RULES)
    rows = per_device['rows']
    assert sorted((r['devices'], r['kvstore'], r['batch_size'], r['per_device_batch'],
                   r['lr_rule']) for r in rows) == wanted
    for r in rows:
        assert r['kind'] == 'measured' and r['status'] == 'ok' and r['model'] == 'simple-cnn'
        assert r['device_type'] == 'cpu' and r['batch_mode'] == 'per-device'
        assert r['lr'] == pytest.approx(expected_lr(r['lr_rule'], r['batch_size']), rel=1e-12)
        assert r['epochs'] == r['timed_epochs'] == 1
        assert 0 < r['test_acc'] <= 1 and r['sec_per_epoch'] > 0
        # one epoch of NUM_TRAIN samples: samples/s and seconds per epoch agree
        assert r['samples_per_sec'] * r['sec_per_epoch'] == pytest.approx(NUM_TRAIN, rel=1e-9)
    for r in rows + per_device['projection'] + per_device['sync']:
        assert r['machine'] == stamp()['machine'] and r['date']


def test_speedup_and_efficiency_are_samples_per_second_ratios(per_device):
    rows = per_device['rows']
    for r in rows:
        base = [b for b in rows if b['devices'] == 1 and b['kvstore'] == r['kvstore']
                and b['lr_rule'] == r['lr_rule'] and b['per_device_batch'] == r['per_device_batch']]
        assert len(base) == 1
        assert r['speedup'] == pytest.approx(r['samples_per_sec'] / base[0]['samples_per_sec'],
                                             rel=1e-12)
        assert r['efficiency'] == pytest.approx(r['speedup'] / r['devices'], rel=1e-12)
        if r['devices'] == 1:
            assert r['speedup'] == 1.0


def test_report_has_every_run_and_answers_from_the_measurements(per_device):
    text, rows = per_device['report'], per_device['rows']
    for r in rows:
        line = re.search(rf"^\| {r['devices']} \| {r['kvstore']} \| {r['batch_size']} \(32\) \| "
                         rf"{r['lr_rule']} \| {r['lr']:g} \| ([\d.]+) \| (\d+) \| ([\d.]+) \| "
                         rf"(\d+)% \| ([\d.]+) \|$", text, re.M)
        assert line, r
        assert float(line.group(2)) == pytest.approx(r['samples_per_sec'], abs=0.5)
        assert float(line.group(3)) == pytest.approx(r['speedup'], abs=0.005)
        assert float(line.group(5)) == pytest.approx(r['test_acc'], abs=5e-5)
    best = max(rows, key=lambda r: r['samples_per_sec'])
    plural = {1: '1 device', 2: '2 devices'}
    assert (f"Best throughput: **{plural[best['devices']]}**, {best['samples_per_sec']:.0f} "
            'samples/s') in text
    for n in (1, 2):
        top = max((r for r in rows if r['devices'] == n), key=lambda r: r['samples_per_sec'])
        assert (f"- {plural[n]}: {top['samples_per_sec']:.0f} samples/s, speedup "
                f"{top['speedup']:.2f}, efficiency {top['efficiency']:.0%}") in text
    assert '### local or device' in text and not re.search(r'^- 1 device, batch', text, re.M)
    for rule in RULES:  # at 2 devices, the faster kvstore of each pair is named first
        pair = sorted((r for r in rows if r['devices'] == 2 and r['lr_rule'] == rule),
                      key=lambda r: -r['samples_per_sec'])
        line = re.search(rf'^- 2 devices, batch 64, lr rule {rule}: (.*)$', text, re.M)
        assert line and f"{pair[0]['kvstore']} {pair[0]['samples_per_sec']:.0f} samples/s" \
            in line.group(1)
    for png in ('speedup.png', 'efficiency.png', 'accuracy.png'):
        assert f']({png})' in text
    assert '## Projection to more devices (a model, not a measurement)' in text
    assert per_device['printed'].startswith(lab_scaling_report.scaling_table(rows).splitlines()[0])


def least_squares_slope(points):
    """Slope of t = s (N - 1) through the origin, by NumPy's least squares."""
    x = onp.array([[n - 1.0] for n, _ in points])
    t = onp.array([t for _, t in points])
    return float(onp.linalg.lstsq(x, t, rcond=None)[0][0])


def check_projection(result, counts, global_batch_of):
    sync, projection = result['sync'], result['projection']
    for r in sync:  # the synchronisations the fit uses: real ones, with consistent bandwidths
        assert r['sync_s'] > 0 and r['grad_bytes'] == 4 * 129_068
        assert r['alg_gbps'] == pytest.approx(r['grad_bytes'] / r['sync_s'] / 1e9, rel=1e-12)
    for kvstore in {r['kvstore'] for r in projection}:
        rows = [r for r in projection if r['kvstore'] == kvstore]
        assert [r['devices'] for r in rows] == counts
        s = least_squares_slope([(r['devices'], r['sync_s']) for r in sync
                                 if r['kvstore'] == kvstore])
        one = None
        for r in rows:
            n = r['devices']
            assert r['kind'] == 'projection' and r['batch_size'] == global_batch_of(n)
            assert r['sync_slope_s'] == pytest.approx(s, rel=1e-9)
            assert r['t_sync_s'] == pytest.approx(s * (n - 1), rel=1e-9)
            assert r['t_step_s'] == pytest.approx(r['t_compute_s'] + r['t_sync_s'], rel=1e-12)
            sps = r['batch_size'] / r['t_step_s']
            assert r['samples_per_sec'] == pytest.approx(sps, rel=1e-12)
            one = one or sps
            assert r['speedup'] == pytest.approx(sps / one, rel=1e-12)
            assert r['efficiency'] == pytest.approx(sps / one / n, rel=1e-12)
    # t_compute is one measurement per per-device batch, shared by every kvstore and count
    by_batch = {}
    for r in projection:
        by_batch.setdefault(r['per_device_batch'], set()).add(r['t_compute_s'])
    assert all(len(v) == 1 and min(v) > 0 for v in by_batch.values())


def test_projection_follows_its_formula(per_device):
    assert sorted((r['kvstore'], r['devices']) for r in per_device['sync']) == \
        [('device', 2), ('local', 2)]
    check_projection(per_device, [1, 2, 4, 8], lambda n: 32 * n)
    assert {r['per_device_batch'] for r in per_device['projection']} == {32}
    text = per_device['report']
    for phrase in ('t_step(N) = t_compute(b) + t_sync(N)', 't_sync(N) = s (N - 1)',
                   'do not overlap', 'loading a batch', 'as fast as the measured one'):
        assert phrase in text
    for r in per_device['projection']:
        assert re.search(rf"^\| {r['devices']} \| {r['kvstore']} \| {r['batch_size']} \(32\) \| "
                         rf"[\d.]+ \| [\d.]+ \| [\d.]+ \| {r['samples_per_sec']:.0f} \| "
                         rf"{r['speedup']:.2f} \|", text, re.M), r


def test_charts_are_valid_pngs(per_device):
    for name in ('speedup.png', 'efficiency.png', 'accuracy.png'):
        path = per_device['dir'] / name
        assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert image.std() > 0  # something is drawn


def test_fixed_global_batch_is_strong_scaling(fixed_global):
    rows = fixed_global['rows']
    assert [(r['devices'], r['batch_size'], r['lr_rule'], r['batch_mode']) for r in rows] == \
        [(n, 64, 'sqrt', 'global') for n in (1, 2, 3)]
    for r in rows:
        assert r['per_device_batch'] == pytest.approx(64 / r['devices'])
        assert r['lr'] == pytest.approx(expected_lr('sqrt', 64), rel=1e-12)
        assert r['speedup'] == pytest.approx(r['samples_per_sec'] / rows[0]['samples_per_sec'],
                                             rel=1e-12)
    assert sorted(r['devices'] for r in fixed_global['sync']) == [2, 3]
    check_projection(fixed_global, [1, 2, 4], lambda n: 64)
    assert [r['per_device_batch'] for r in fixed_global['projection']] == \
        [math.ceil(64 / n) for n in (1, 2, 4)]
    assert 'local or device' not in fixed_global['report']  # one kvstore: nothing to compare


def test_the_default_measures_each_configurations_speed_over_a_few_steps(fixed_global):
    assert sorted(os.listdir(fixed_global['dir'])) == \
        sorted(set(FILES) - {'accuracy.png'} | {'results.json'})  # no accuracy measured
    rows, text = fixed_global['rows'], fixed_global['report']
    for r in rows:
        assert r['kind'] == 'steps' and r['status'] == 'ok' and r['timed_steps'] == STEPS
        assert r['epochs'] is None and r['sec_per_epoch'] is None and r['test_acc'] is None
        # every timed step trains the whole global batch: samples/s x seconds a step = 64
        assert r['samples_per_sec'] * r['sec_per_step'] == pytest.approx(64, rel=1e-9)
        assert 0 < r['train_loss'] < 10
        assert re.search(rf"^\| {r['devices']} \| device \| 64 \({r['per_device_batch']:g}\) \| "
                         rf"sqrt \| {r['lr']:g} \| {r['sec_per_step'] * 1e3:.1f} \| "
                         rf"{r['samples_per_sec']:.0f} \| {r['speedup']:.2f} \| "
                         rf"{r['efficiency']:.0%} \|$", text, re.M), r
    assert f'{STEPS} timed training steps of each configuration after 2 untimed ones' in text
    assert 'Not measured: this sweep measured speed' in text and '`--full`' in text
    assert 'accuracy.png' not in text and 'test acc' not in text
    assert fixed_global['printed'].startswith(
        lab_scaling_report.scaling_table(rows).splitlines()[0])


def test_a_diverging_run_is_recorded_and_no_count_of_two_means_no_projection(
        script, fashion_dir, tmp_path):
    result = sweep(script, tmp_path / 'out', '--full', '--cpu-devices', '1',
                   '--batch-per-device', '64',
                   '--base-lr', '10000', '--data-dir', str(fashion_dir))
    assert [(r['devices'], r['status'], r['samples_per_sec']) for r in result['rows']] == \
        [(1, 'diverged', None)]
    assert result['projection'] == [] and result['sync'] == []
    assert '1 run(s) diverged' in result['report']
    assert 'No projection: it needs a synchronisation measured on at least 2 devices' in \
        result['report']


def test_without_a_one_device_run_speedup_is_left_empty_and_said(script, fashion_dir,
                                                                 tmp_path):
    result = sweep(script, tmp_path / 'out', '--full', '--cpu-devices', '2', '--counts', '2',
                   '--batch-per-device', '32', '--project-to', '2', '--data-dir', str(fashion_dir))
    assert [(r['devices'], r['speedup'], r['efficiency']) for r in result['rows']] == \
        [(2, None, None)]
    assert result['rows'][0]['samples_per_sec'] > 0
    assert '> No 1-device run in the sweep: speedup and efficiency are left empty.' in \
        result['report']
    assert 'efficiency n/a: no 1-device run of this series' in result['report']
    # the projection still has its own 1-device point: a measured training step
    assert [r['devices'] for r in result['projection']] == [1, 2]


def test_device_counts_and_learning_rate_rules():
    assert lab_counts.device_counts(6) == [1, 2, 4, 6]
    assert lab_counts.device_counts(16) == [1, 2, 4, 8, 16]
    assert lab_counts.device_counts(4, minimum=2) == [2, 4] and lab_counts.device_counts(1, 2) == []
    assert scaling.learning_rate('linear', 0.1, 512) == pytest.approx(0.2)  # the book's 2 GPUs
    assert scaling.learning_rate('sqrt', 0.1, 1024) == pytest.approx(0.2)
    assert scaling.learning_rate('fixed', 0.1, 1024) == 0.1
    with pytest.raises(gm.GluonMultiGPUError, match='choose one of linear, fixed, sqrt'):
        scaling.learning_rate('cubic', 0.1, 256)


@pytest.mark.skipif(gm.num_gpus() > 0, reason='checks the fallback without a GPU')
def test_without_gpus_or_flags_the_sweep_uses_cpu_contexts_and_says_so():
    kind, counts, note = lab_counts.resolve_counts(cpu_default=[1, 2])
    assert (kind, counts) == ('cpu', [1, 2]) and note.startswith('no GPU found')


@pytest.mark.parametrize('argv, message', [
    (['--num-gpus', str(gm.num_gpus() + 1)], 'GPU(s) requested but'),
    (['--cpu-devices', '2', '--counts', '1', '4'], '--counts 4 exceeds --cpu-devices 2'),
    (['--cpu-devices', '4', '--global-batch', '2'], 'a global batch of 2 cannot be split '
     'across 4 devices'),
    (['--cpu-devices', '2', '--kvstores', 'nccl'], NCCL_ON_CPU),
    (['--cpu-devices', '2', '--out', '{tmp}/file.txt'], 'is a file; give a directory'),
    (['--cpu-devices', '2', '--out', '{tmp}/no/such'], 'does not exist; create it first'),
    (['--cpu-devices', '2', '--data-dir', '/no/such/dir', '--out', '{tmp}/r'],
     '/no/such/dir does not exist'),
    (['--cpu-devices', '2', '--data-dir', '{truncated}', '--out', '{tmp}/r'],
     'not a complete gzip file'),
    (['--cpu-devices', '2', '--num-train', '1', '--out', '{tmp}/r', '--data-dir', '{data}'],
     '1 training images cannot be split across 2 devices'),
])
def test_bad_input_is_one_line_status_2_and_no_files(script, argv, message, tmp_path,
                                                     truncated_dir, fashion_dir, capsys):
    (tmp_path / 'file.txt').write_text('x')
    argv = [a.format(tmp=tmp_path, truncated=truncated_dir, data=fashion_dir) for a in argv]
    assert script.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == '' and len(captured.err.splitlines()) == 1
    assert message in captured.err and 'Traceback' not in captured.err
    assert os.listdir(tmp_path) == ['file.txt']


def test_a_failure_while_writing_leaves_no_files(per_device, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError('disk full')
    monkeypatch.setattr(lab_scaling_report, 'accuracy_batch_chart', broken)
    rows, projection, sync = per_device['rows'], per_device['projection'], per_device['sync']
    config = {'model': 'simple-cnn', 'device_type': 'cpu'}
    with pytest.raises(OSError):
        lab_scaling_report.write_scaling_outputs(tmp_path / 'new', config, rows, projection, sync)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('argv, message', [
    (['--lr-rule', 'cubic'], "invalid choice: 'cubic'"),
    (['--model', 'vgg'], "invalid choice: 'vgg'"),
    (['--base-lr', '0'], '0 is not a positive finite number'),
    (['--batch-per-device', '0'], '0 is not positive'),
    (['--batch-per-device', '32', '--global-batch', '64'], 'not allowed with argument'),
    (['--num-epochs', 'two'], "'two' is not an integer"),
    (['--steps', '0'], '0 is not positive'),
    (['--steps', '5', '--full'], 'argument --full: not allowed with argument --steps'),
    (['--seed', '-1'], '-1 is negative'),
    (['--progress-interval', '-2'], '-2 is not a finite number of 0 or more'),
])
def test_bad_arguments_stop_with_status_2(script, argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        script.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and message in err


def test_help_states_definitions_and_defaults(script, capsys):
    with pytest.raises(SystemExit):
        script.main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    for phrase in ('by default the training speed of every configuration over --steps N',
                   f'(default {scaling_cli.STEPS}, after 2 untimed ones)',
                   f'about {scaling_cli.QUICK_TIME} with the defaults',
                   f'the first measurement kept after about {scaling_cli.FIRST_TIME}',
                   '--full every configuration trains --num-epochs epochs',
                   f'about {scaling_cli.FULL_TIME} with the defaults',
                   'says in one line what was kept',
                   'speedup samples/s on N devices / samples/s of the 1-device run',
                   'efficiency speedup / N', 'linear = base x B/256', '(default: 256',
                   '(default: 0.1, the book)', '(default: 16, a p2.16xlarge)',
                   'a model, not a measurement', 'exit status 2', '(default: scaling-report)'):
        assert phrase in text


def test_the_kvstore_answer_pairs_the_rounds_each_configuration_shares():
    """Known speeds, each configuration measured in 4 rounds with a load that halves them all in
    rounds 2 and 4: device 20% slower is named, an equal pair is called equal, a noisy one cannot tell, one
    round names none."""
    def row(kvstore, rounds):
        return {'devices': 2, 'batch_mode': 'per-device', 'batch_size': 64, 'lr_rule': 'linear',
                'kvstore': kvstore, 'samples_per_sec': sorted(rounds)[(len(rounds) - 1) // 2],
                'rounds': rounds}
    drift = [1.0, 0.5, 1.01, 0.49]
    slower = lab_scaling_report.fastest_kvstores(
        [row('local', [1000 * d for d in drift]), row('device', [800 * d * 1.01 for d in drift])])
    assert slower[0].startswith('- 2 devices, batch 64, lr rule linear: **local** fastest (4 '
                                'rounds): local ') and "95% interval of local's speed-up 1.2" \
        in slower[0], slower
    equal = lab_scaling_report.fastest_kvstores(
        [row('local', [1000 * d for d in drift]),
         row('device', [1000 * d * w for d, w in zip(drift, (1.01, 0.99, 1.0, 1.005))])])
    assert ': local and device equally fast (the whole interval within 0.97-1.03) (4 rounds)' \
        in equal[0], equal
    unsure = lab_scaling_report.fastest_kvstores(
        [row('local', [1000 * d for d in drift]),
         row('device', [1000 * d * w for d, w in zip(drift, (1.3, 0.8, 1.1, 0.95))])])
    assert ': cannot tell at this load whether local or device is faster (more rounds or a ' \
        'quieter machine would tell) (4 rounds)' in unsure[0], unsure
    one = lab_scaling_report.fastest_kvstores(
        [dict(row('local', [1000]), rounds=None), dict(row('device', [800]), rounds=None)])
    assert 'local faster in the one round measured, which cannot tell a difference from noise' \
        in one[0], one

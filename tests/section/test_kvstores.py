"""Comparing kvstores: same parameters whatever the back end, the report, and nccl's answer."""
import json
import os
import re
import signal
import threading

import mxnet as mx
import numpy as onp
import pytest
from mxnet import init

import gluon_multigpu as gm
from gluon_multigpu.base.machine import stamp
from gluon_multigpu.machinery.training import EpochRecord, TrainResult
from conftest import load_script


@pytest.fixture(scope='module')
def train_script():
    return load_script('train')


def test_report_compares_every_kvstore_on_the_same_weights(train_script, fashion_dir, tmp_path,
                                                            capsys):
    # 3 contexts: the sums have three terms, so back ends may differ in float rounding only.
    # The one run that checks the kvstores agree, end to end through the CLI and its outputs.
    # One batch of 60 an epoch: after epoch 1 (one step) the parameters agree to rounding;
    # over many steps rounding differences grow (a ReLU flips on one), without a bound.
    report, out_json, out_png = tmp_path / 'report', tmp_path / 'runs.json', tmp_path / 'acc.png'
    argv = ['--cpu-devices', '3', '--model', 'simple-cnn', '--num-epochs', '2', '--num-train',
            '60', '--num-test', '200', '--batch-size', '60', '--lr', '0.2', '--kvstore', 'local',
            'device', 'none', '--data-dir', str(fashion_dir), '--report', str(report),
            '--json', str(out_json), '--plot', str(out_png), '--progress-interval', '0']
    assert train_script.main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith('training simple-cnn on fashion-mnist: 60 train / 200 test '
                               'images, batch 60 (20 per device), lr 0.2, 2 epoch(s)')
    epoch_lines = [l for l in lines if l.startswith('epoch ')]
    assert len(epoch_lines) == 6
    # The kvstores take turns, epoch after epoch, every other round backwards.
    heads = [re.sub(r'; the comparison ends in about \d+ s\)$', ')', l) for l in lines
             if l.startswith('-- ')]
    assert heads == [f'-- kvstore {k}, epoch {e}/2 ({i} of 6)' for i, (e, k) in enumerate(
        [(1, 'local'), (1, 'device'), (1, 'none'), (2, 'none'), (2, 'device'), (2, 'local')], 1)]
    assert [l[:9] for l in epoch_lines] == ['epoch 1/2'] * 3 + ['epoch 2/2'] * 3
    assert re.match(r'epoch 2/2: loss \d\.\d{4}, train acc 0\.\d{3}, test acc 0\.\d{3}, '
                    r'\d+\.\d s, \d+ samples/s$', epoch_lines[3])
    finals = [re.match(r'^test acc: (\d\.\d\d), (\d+\.\d) sec/epoch on \[cpu\(0\), cpu\(1\), '
                       r'cpu\(2\)\] with kvstore (\w+)$', l)
              for l in lines if l.startswith('test acc:')]
    assert len(finals) == 3 and all(finals)
    assert [f.group(3) for f in finals] == ['local', 'device', 'none']  # each line names its own
    assert json.loads(out_json.read_text()) == json.loads((report / 'runs.json').read_text())
    for run, final in zip(json.loads(out_json.read_text())['runs'], finals):
        assert len(run['epochs']) == 2 and run['epochs'][0]['samples'] == 60
        assert f"{run['epochs'][-1]['test_acc']:.2f}" == final.group(1)
        assert f"{run['sec_per_epoch']:.1f}" == final.group(2)
    assert out_png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert sorted(os.listdir(tmp_path)) == ['acc.png', 'report', 'runs.json']  # no temporary files
    assert sorted(os.listdir(report)) == ['accuracy.png', 'report.md', 'runs.json', 'seconds.png']
    for png in ('accuracy.png', 'seconds.png'):
        assert (report / png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    data = json.loads((report / 'runs.json').read_text())
    assert [r['kvstore'] for r in data['runs']] == ['local', 'device', 'none']
    assert data['reference'] == 'local' and data['config']['num_train'] == 60
    assert data['machine'] == stamp()['machine'] and data['date']
    for run in data['runs']:
        # After one step, rounding: conftest.one_step_bound gives 1e-8 (dense) to 1.4e-5 (first
        # convolution) for these shapes, data and lr; 7.5e-9 measured (an ulp of the largest
        # weights), where a wrong sum moves them by an update (1e-3). After two, only reported.
        assert len(run['param_diff']) == 2 and run['param_diff'][0] < 1e-5
        assert run['device_spread'] == [0.0, 0.0]
        assert run['running_stats_spread'] == [None, None]  # the simple CNN has no BatchNorm
    losses = {r['kvstore']: [e['train_loss'] for e in r['epochs']] for r in data['runs']}
    onp.testing.assert_allclose(losses['device'], losses['local'], rtol=1e-5)
    onp.testing.assert_allclose(losses['none'], losses['local'], rtol=1e-5)
    text = (report / 'report.md').read_text()
    assert text.startswith('# kvstore comparison: simple-cnn on fashion-mnist, '
                           '[cpu(0), cpu(1), cpu(2)]')
    assert '60 training / 200 test images, batch 60 (20 per device), lr 0.2, 2 epoch(s)' in text
    for run in data['runs']:  # every configuration is in the table, with its measured figures
        row = re.search(rf'^\| {run["kvstore"]} \| cpu\(0\), cpu\(1\), cpu\(2\) \| ([\d.]+) \| '
                        rf'([^|]+) \| (\d+) \| ([\d.]+) \|', text, re.M)
        assert row, run['kvstore']
        assert float(row.group(1)) == pytest.approx(run['sec_per_epoch'], abs=0.006)
        # beside the mean, the time against the fastest's: one round judged, no interval
        assert re.fullmatch(r'reference|\d\.\d\dx \(1 round\): cannot tell', row.group(2))
        assert float(row.group(4)) == pytest.approx(run['epochs'][-1]['test_acc'], abs=1e-4)
    assert text.count('| reference |') == 1
    assert re.search(r'\*\*Answer:\*\* on 3 devices, kvstore', text)
    assert '![test accuracy per epoch](accuracy.png)' in text
    assert out.count('test acc: ') == 3 and '| none | cpu(0), cpu(1), cpu(2) |' in out


@pytest.mark.skipif(gm.kvstores.has_nccl(), reason='this MXNet build has NCCL')
def test_nccl_without_nccl_is_one_line_naming_the_build(train_script, capsys, tmp_path):
    status = train_script.main(['--cpu-devices', '2', '--kvstore', 'local', 'nccl',
                                '--report', str(tmp_path / 'r')])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == '' and len(captured.err.splitlines()) == 1
    assert 'kvstore nccl needs an MXNet build with NCCL' in captured.err
    assert gm.compat.GPU_INSTALL in captured.err
    assert os.listdir(tmp_path) == []


def test_nccl_on_cpu_contexts_is_refused_even_with_nccl(monkeypatch):
    monkeypatch.setattr(gm.kvstores, 'has_nccl', lambda: True)
    with pytest.raises(gm.GluonMultiGPUError, match='with CPU contexts choose local, device'):
        gm.kvstores.check_kvstore('nccl', gm.cpu_devices(2))
    gm.kvstores.check_kvstore('nccl', [mx.gpu(0), mx.gpu(1)])  # accepted: GPUs and NCCL


@pytest.mark.parametrize('make, message', [
    (lambda d: d / 'file.txt', 'is a file; give a directory'),
    (lambda d: d / 'no' / 'such', 'does not exist; create it first'),
])
def test_report_directory_that_cannot_be_made_is_refused(train_script, tmp_path, capsys, make,
                                                          message):
    (tmp_path / 'file.txt').write_text('x')
    status = train_script.main(['--cpu-devices', '2', '--report', str(make(tmp_path))])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and message in err


def small_net(seed, devices):
    mx.random.seed(seed)
    net = gm.simple_cnn()
    net.initialize(init.Uniform(0.07), ctx=devices)
    net(mx.np.zeros((1, 1, 28, 28), ctx=devices[0]))
    return net


def test_param_tracker_measures_the_largest_difference():
    devices = gm.cpu_devices(2)
    a, b = small_net(1, devices), small_net(1, devices)
    param = list(b.collect_params().values())[2]
    with gm.ParamTracker() as tracker:
        tracker.record('a', 1, a)
        tracker.record('b', 1, b)
        for ctx in devices:  # change one weight by 0.25 on every device
            data = param.data(ctx)
            data[0] += 0.25
        tracker.record('a', 2, a)
        tracker.record('b', 2, b)
        param.data(devices[1])[0] += 1.0  # now the devices of b disagree (diff reads the first)
        tracker.record('b', 2, b)
    assert tracker.reference == 'a'
    assert tracker.diff == {'a': [0.0, 0.0], 'b': [0.0, pytest.approx(0.25), pytest.approx(0.25)]}
    assert tracker.spread['b'] == [0.0, 0.0, pytest.approx(1.0)]


def test_a_tracker_of_one_run_keeps_no_copy_of_the_parameters(capsys):
    """45 MB an epoch for ResNet-18: a single run has nothing to compare them with."""
    net = small_net(1, gm.cpu_devices(2))
    with gm.ParamTracker(compare=False) as tracker:
        for epoch in (1, 2, 3):
            tracker.record('device', epoch, net)
        assert tracker._saved == {} and tracker.diff == {'device': [0.0, 0.0, 0.0]}
    with gm.ParamTracker() as tracker:
        tracker.record('device', 1, net)
        assert list(tracker._saved) == [1]
    # the CLI keeps copies only when it compares several kvstores
    train = load_script('train')
    args = ['--cpu-devices', '2', '--model', 'simple-cnn', '--synthetic', '--num-train', '64',
            '--num-test', '16', '--num-epochs', '2', '--progress-interval', '0']
    made = []
    from gluon_multigpu.runs import train_run  # the module that makes the run's tracker
    real = train_run.ParamTracker

    class Spy(real):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)
    train_run.ParamTracker = Spy
    try:
        assert train.main(args) == 0
        assert train.main(args + ['--kvstore', 'local', 'device']) == 0
    finally:
        train_run.ParamTracker = real
    capsys.readouterr()
    assert [t.compare for t in made] == [False, True]


def test_batchnorm_running_statistics_stay_per_device_while_the_weights_agree(fashion_test):
    # MXNet keeps BatchNorm's running mean and variance per device, each from
    # its own shards: the tracker reports them apart from the weights.
    images, labels = fashion_test
    X = mx.np.array(images[:8, None] / 255.0, dtype='float32')
    y = mx.np.array(labels[:8], dtype='int32')
    devices = gm.cpu_devices(2)
    mx.random.seed(0)
    net = gm.resnet18(10)
    net.initialize(gm.default_initializer('resnet18'), ctx=devices)
    trainer = gm.kvstores.make_trainer(net, 0.1, 'device')
    for _ in range(2):  # (after the first step, with deferred initialisation, they still agree)
        gm.train_batch(net, X, y, mx.gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
    with gm.ParamTracker() as tracker:
        tracker.record('device', 1, net)
    assert tracker.spread['device'] == [0.0]
    assert tracker.stats_spread['device'][0] > 1e-4
    running = [p for p in net.collect_params().values() if p.grad_req == 'null']
    mean = running[0].list_data()  # the first BatchNorm's running mean on the two devices
    assert not onp.allclose(mean[0].asnumpy(), mean[1].asnumpy())
    table = gm.comparison_table([result('device', 1.0)], tracker)
    assert table.splitlines()[2].endswith(f'| 0 | 0 | {tracker.stats_spread["device"][0]:.1e} |')


def result(kvstore, *seconds):
    r = TrainResult(devices=['cpu(0)', 'cpu(1)'], kvstore=kvstore, lr=0.1)
    for i, sec in enumerate(seconds, 1):
        r.epochs.append(EpochRecord(i, 1.0, 0.5, 0.5, sec, 0.1, 100))
    return r


def test_recommend_names_the_fastest_only_beyond_the_interval_of_the_paired_ratios():
    """Epochs of the same round are compared (round 1, the warm-up, left out): study/paired.py
    computes the intervals (tests/training/test_paired.py checks them against NumPy)."""
    steady = {'local': (1.0, 1.0, 1.0, 1.0), 'device': (1.01, 1.0, 1.005, 1.0),
              'none': (0.99, 0.995, 0.995, 0.995)}
    answer = gm.recommend([result(k, *v) for k, v in steady.items()])
    assert re.fullmatch(r'on 2 devices, kvstores none, local and device are equally fast \(local '
                        r'vs none 1\.0\dx \(95% interval [\d.-]+, 3 rounds\); device vs none '
                        r'1\.0\dx \(95% interval [\d.-]+, 3 rounds\): the whole interval within '
                        r'0\.97-1\.03\)\.', answer), answer
    # 2% apart, but the interval reaches beyond 0.97-1.03: this run cannot tell
    unsure = gm.recommend([result('local', 1.0, 1.0, 1.01, 0.99), result('device', 1.0, 1.0,
                                                                         1.03, 1.01)])
    assert unsure.startswith('on 2 devices, cannot tell at this load whether kvstore local or '
                             'kvstore device is faster (device vs local 1.02x'), unsure
    # local's first epoch paid the process's warm-up: not judged
    clear = gm.recommend([result('local', 4.0, 2.02, 1.98, 2.0), result('device', 1.0, 1.01, 0.99, 1.0)])
    assert clear.startswith('on 2 devices, kvstore device is fastest; kvstore local takes 100% '
                            'longer (2.00x (95% interval 2.00-2.00, 3 rounds)).'), clear
    # epochs that vary by 20% with the load, alike for both in each round: 50% is named
    noisy = [result('local', 1.0, 1.2, 1.0, 1.4), result('device', 1.5, 1.8, 1.5, 2.1)]
    assert gm.recommend(noisy).startswith('on 2 devices, kvstore local is fastest; kvstore '
                                          'device takes 50% longer (1.50x')


def test_two_epochs_per_kvstore_are_not_enough_to_name_a_winner():
    assert gm.recommend([result('local', 1.05, 1.05), result('device', 1.0, 1.0)]) == (
        'on 2 devices, kvstore device was fastest in the one round judged, which cannot tell a '
        'difference from noise (the first round warms the process and is judged only alone): '
        'measure 3 or more rounds.')


def test_a_one_epoch_chart_has_integer_ticks_every_run_visible_and_no_warning(tmp_path):
    import warnings
    runs = [result(k, 1.0) for k in ('local', 'device', 'none')]
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # a library warning would reach the user
        gm.charts.accuracy_chart(tmp_path / 'a.png', runs)
        animator = gm.Animator(xlabel='epoch', legend=['local', 'device', 'none'],
                               xlim=[0.5, 1.5])
        animator.add(1, [0.5, 0.5, 0.5])
        ax = animator.figure().axes[0]
    assert list(ax.get_xticks()) == [1]
    lines = ax.get_lines()
    assert [l.get_fillstyle() for l in lines] == ['none'] * 3  # hollow: the ones below show
    assert len({l.get_markersize() for l in lines}) == 3 and len({l.get_marker() for l in lines}) == 3
    assert (tmp_path / 'a.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def comparison(fashion_dir, tmp_path, *extra):
    return ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '2', '--num-train',
            '256', '--num-test', '64', '--batch-size', '64', '--kvstore', 'local', 'device',
            'none', '--data-dir', str(fashion_dir), '--report', str(tmp_path / 'report'),
            '--json', str(tmp_path / 'runs.json'), *extra]


def test_a_comparison_estimates_all_its_runs_and_names_the_one_measured(train_script, fashion_dir,
                                                                        tmp_path, capsys):
    argv = comparison(fashion_dir, tmp_path, '--progress-interval', '0.000001')
    assert train_script.main(argv) == 0
    captured = capsys.readouterr()
    err, out = captured.err.splitlines(), captured.out.splitlines()
    # said once, from the first epoch's first measured steps: all the epochs of all three runs
    estimate = [l for l in err if not l.startswith('  ')]
    assert len(estimate) == 1 and re.fullmatch(
        r'the kvstore comparison of local, device and none takes about \d+ s from now \(2 epochs '
        r'of each, taken in turn: 6 epochs, each expected to take as long as this one, estimated '
        r'from its first 2 steps\)', estimate[0]), estimate
    order = ['local', 'device', 'none', 'none', 'device', 'local']  # round 2 backwards
    for position, kvstore in enumerate(order, 1):
        lines = [l for l in err if l.startswith(f'  kvstore {kvstore} on 2 CPUs ({position} of 6): ')]
        assert len(lines) == 3, err  # steps 2 to 4 of the epoch
        assert all(re.search(r', epoch ends in \d+ s, kvstore comparison in \d+ s$', l)
                   for l in lines), lines
    heads = [l for l in out if l.startswith('-- kvstore ')]
    assert heads[0] == '-- kvstore local, epoch 1/2 (1 of 6)'
    assert all(re.fullmatch(rf'-- kvstore {k}, epoch {1 + (i >= 3)}/2 \({i + 1} of 6; the '
                            r'comparison ends in about \d+ s\)', l)
               for i, (k, l) in enumerate(zip(order, heads)) if i), heads
    data = json.loads((tmp_path / 'runs.json').read_text())
    assert data['complete'] and data['partial'] is None and len(data['runs']) == 3
    assert (tmp_path / 'report' / 'report.md').read_text().startswith('# kvstore comparison: ')


def test_the_time_left_of_a_schedule_follows_the_runs_measured(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(gm.progress.time, 'monotonic', lambda: now[0])
    schedule = gm.progress.Schedule(['local', 'device', 'none'])
    assert schedule.left() is None and schedule.units == 3  # nothing measured yet
    schedule.begin()
    now[0] += 10  # 10 s into the first run, 30 s left of it: 40 s each, 2 more to come
    assert schedule.left(30) == 30 + 2 * 40 and schedule.position() == '1 of 3'
    now[0] += 30
    schedule.end()
    assert schedule.left() == 2 * 40
    schedule.begin()
    now[0] += 5  # the finished run's 40 s stands for the one not begun
    assert schedule.left(50) == 50 + 40 and schedule.position() == '2 of 3'
    rounds = gm.progress.Schedule(['local', 'device'], rounds=3)  # epochs taken in turn
    assert rounds.units == 6
    rounds.begin()
    now[0] += 10
    assert rounds.left(5) == 5 + 5 * 15 and rounds.position() == '1 of 6'


def test_ctrl_c_in_a_comparison_keeps_the_epochs_measured_marked_partial(
        train_script, fashion_dir, tmp_path, monkeypatch, capsys):
    """Results are written after each round; a stop rewrites them with every epoch measured,
    marked partial, and begins no other epoch."""
    original = gm.training.evaluate_accuracy_gpus
    calls, seen = [], {}

    def evaluate(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # epoch 2 of device (round 2 goes none, device, local)
            seen['report'] = (tmp_path / 'report' / 'report.md').read_text()
            seen['json'] = json.loads((tmp_path / 'runs.json').read_text())
            # To this process from its main thread: the handler has run when os.kill returns
            # (Python checks for signals before it returns), so nothing to wait for.
            assert threading.current_thread() is threading.main_thread()
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)
    monkeypatch.setattr(gm.training, 'evaluate_accuracy_gpus', evaluate)
    status = train_script.main(comparison(fashion_dir, tmp_path, '--progress-interval', '0'))
    captured = capsys.readouterr()
    assert status == 130 and len(calls) == 5  # local's epoch 2 was not begun
    assert seen['json']['complete'] is False and \
        [len(r['epochs']) for r in seen['json']['runs']] == [1, 1, 1]
    assert seen['json']['partial'] == ('written after round 1 of 2 (epoch 1 of every kvstore), '
                                       'while the comparison went on (a later version replaces '
                                       'this one)')
    assert seen['report'].startswith('# kvstore comparison (partial): ')
    err = captured.err.splitlines()
    measured = 'epochs 1-2 of kvstore device, none; epoch 1 of kvstore local'
    assert err[-1] == ('interrupted by SIGINT at the end of epoch 2 of kvstore device: epoch 2 '
                       f'of kvstore local not begun; the results of {measured} are kept, marked '
                       f'partial, in {tmp_path / "runs.json"} and {tmp_path / "report"}/'), err
    data = json.loads((tmp_path / 'runs.json').read_text())
    assert data == json.loads((tmp_path / 'report' / 'runs.json').read_text())
    assert [(r['kvstore'], len(r['epochs'])) for r in data['runs']] == \
        [('local', 1), ('device', 2), ('none', 2)]
    # each epoch's load (these epochs are too short for the CPU figures: None)
    assert all(len(r['load']) == len(r['epochs']) and r['load'][0]['load'] >= 0 and
               set(r['load'][0]) == {'load', 'others', 'steal', 'cores'} for r in data['runs'])
    assert data['complete'] is False and data['partial'] == (
        f'interrupted by SIGINT between two epochs; measured: {measured}')
    assert data['paired']['variants'] == ['local', 'device', 'none']
    text = (tmp_path / 'report' / 'report.md').read_text()
    assert text.startswith('# kvstore comparison (partial): simple-cnn on fashion-mnist')
    assert f'> **Partial:** {data["partial"]}' in text and '| local | cpu(0), cpu(1) |' in text
    assert re.search(r'^\| 2 \| - \| [\d.]+ \| [\d.]+ \|', text, re.M)  # the rounds: local's 2nd
    assert '**Answer:** on 2 devices, kvstore ' in text
    assert sorted(os.listdir(tmp_path / 'report')) == ['accuracy.png', 'report.md', 'runs.json',
                                                       'seconds.png']
    assert '| none | cpu(0), cpu(1) |' in captured.out  # the table of what was measured


def test_a_recommendation_names_the_kvstores_not_measured():
    def result(kvstore, seconds):
        r = TrainResult(devices=['cpu(0)', 'cpu(1)'], kvstore=kvstore, lr=0.1)
        for epoch, s in enumerate(seconds, 1):
            r.epochs.append(EpochRecord(epoch, 0.5, 0.8, 0.8, s, 0.1, 1000))
        return r
    results = [result('local', [1.0, 1.0, 1.0]), result('device', [2.0, 2.0, 2.0])]
    assert gm.recommend(results, pending=['none']).endswith('; none not measured.')
    assert gm.recommend(results[:1], pending=['device', 'none']) == (
        'only kvstore local has an epoch measured (device, none not measured): nothing to '
        'compare yet.')
    assert gm.recommend(results[:1]) == 'only kvstore local was run; give several to compare.'


def test_a_kvstore_trains_in_a_comparison_exactly_as_alone(train_script, tmp_path, capsys):
    """Taken in turn, epoch after epoch, each run keeps its own weights, Trainer and batches:
    device's losses and accuracies in a comparison are bit for bit those of device alone."""
    common = ['--cpu-devices', '2', '--model', 'simple-cnn', '--synthetic', '--num-train', '384',
              '--num-test', '128', '--batch-size', '64', '--num-epochs', '3',
              '--progress-interval', '0']
    assert train_script.main([*common, '--kvstore', 'local', 'device',
                              '--json', str(tmp_path / 'both.json')]) == 0
    assert train_script.main([*common, '--kvstore', 'device',
                              '--json', str(tmp_path / 'alone.json')]) == 0
    capsys.readouterr()
    both = json.loads((tmp_path / 'both.json').read_text())['runs'][1]
    alone = json.loads((tmp_path / 'alone.json').read_text())['runs'][0]
    assert both['kvstore'] == alone['kvstore'] == 'device'
    figures = [[(e['train_loss'], e['train_acc'], e['test_acc']) for e in r['epochs']]
               for r in (both, alone)]
    assert figures[0] == figures[1] and len(figures[0]) == 3
    assert both['param_diff'][0] < 1e-5  # and device agrees with local after its first step

import json
import time

import pytest

import gluon_multigpu as gm
from gluon_multigpu.filesafety.output import atomic_write
from gluon_multigpu.machinery.training import EpochRecord, TrainResult
from gluon_multigpu.study import paired

PNG = b'\x89PNG\r\n\x1a\n'


def test_timer_records_intervals():
    timer = gm.Timer()
    time.sleep(0.02)  # the time measured (the feature, not an order)
    first = timer.stop()
    timer.start()
    time.sleep(0.01)
    timer.stop()
    assert first >= 0.02 and len(timer.times) == 2
    assert timer.sum() == pytest.approx(sum(timer.times))
    assert timer.avg() == pytest.approx(timer.sum() / 2)
    assert timer.cumsum()[-1] == pytest.approx(timer.sum())


def test_accumulator_sums_and_resets():
    acc = gm.Accumulator(2)
    acc.add(1, 2.5)
    acc.add(3, 0.5)
    assert (acc[0], acc[1]) == (4.0, 3.0)
    acc.reset()
    assert acc.data == [0.0, 0.0]


def test_animator_keeps_the_books_data_layout_and_writes_a_png(tmp_path):
    animator = gm.Animator(xlabel='epoch', ylabel='test acc', legend=['local', 'device'],
                           xlim=[1, 3])
    for epoch, accs in enumerate([(0.5, 0.52), (0.7, 0.69), (0.8, 0.81)], start=1):
        animator.add(epoch, accs)
    assert animator.Y[0][-1] == 0.8 and animator.Y[1] == [0.52, 0.69, 0.81]
    assert animator.X[0] == [1, 2, 3]
    path = tmp_path / 'acc.png'
    animator.save(str(path))
    assert path.read_bytes()[:8] == PNG and [p.name for p in tmp_path.iterdir()] == ['acc.png']


def test_atomic_write_leaves_nothing_when_the_block_fails(tmp_path):
    path = tmp_path / 'out.json'
    with pytest.raises(RuntimeError):
        with atomic_write(str(path)) as f:
            f.write('{"partial": ')
            raise RuntimeError('disk full')
    assert list(tmp_path.iterdir()) == []
    gm.write_json(str(path), {'a': [1, 2]})
    assert json.loads(path.read_text()) == {'a': [1, 2]}
    assert list(tmp_path.iterdir()) == [path]


def make_result(kvstore, seconds):
    result = TrainResult(devices=['gpu(0)', 'gpu(1)'], kvstore=kvstore, lr=0.2)
    for i, s in enumerate(seconds, start=1):
        result.epochs.append(EpochRecord(i, 0.5, 0.8, 0.9 + i / 1000, s, 1.0, 60000))
    return result


def test_final_line_is_the_books_line():
    result = make_result('device', [7.8, 8.0])
    assert result.final_line() == 'test acc: 0.90, 7.9 sec/epoch on [gpu(0), gpu(1)]'
    assert result.samples_per_sec == pytest.approx(120000 / 15.8)


def test_final_line_without_a_test_set_or_an_epoch_says_so():
    result = make_result('device', [7.8])
    result.epochs[0] = EpochRecord(1, 0.5, 0.8, None, 7.8, 0.0, 60000)  # no evaluation
    assert result.final_line() == 'no test set, 7.8 sec/epoch on [gpu(0), gpu(1)]'
    assert TrainResult(devices=['cpu(0)'], kvstore='device', lr=0.1).final_line() == \
        'no epoch trained on [cpu(0)]'
    assert gm.Progress.__module__ == 'gluon_multigpu.observe.progress'  # exported with the others


def test_comparison_table_carries_each_ratio_and_its_interval_beside_the_mean():
    table = gm.comparison_table([make_result('local', [10.0]), make_result('device', [8.0])])
    rows = table.splitlines()
    assert len(rows) == 4 and ' sec/epoch | time vs device (95% interval): answer |' in rows[0]
    assert rows[2] == ('| local | gpu(0), gpu(1) | 10.00 | 1.25x (1 round): cannot tell | 6000 | '
                       '0.9010 |')
    assert rows[3].startswith('| device | gpu(0), gpu(1) | 8.00 | reference | 7500 |')
    # Rounds 2-4 judged (round 1 warms the process): the cell is the answer's ratio and interval.
    local, device = [12.0, 10.0, 10.2, 9.9], [9.0, 8.0, 8.1, 8.0]
    results = [make_result('local', local), make_result('device', device)]
    r = paired.ratio_of(local[1:], device[1:])
    assert r.low > 1.03
    cell = f'{r.median:.2f}x ({r.low:.2f}-{r.high:.2f}): slower'
    assert gm.comparison_table(results).splitlines()[2].startswith(
        f'| local | gpu(0), gpu(1) | {sum(local) / 4:.2f} | {cell} |')
    assert f'{r.median:.2f}x (95% interval {r.low:.2f}-{r.high:.2f}, 3 rounds)' in \
        gm.recommend(results)
    alone = gm.comparison_table(results[:1])  # one run: nothing to compare it with
    assert 'time vs' not in alone and alone.splitlines()[2] == (
        f'| local | gpu(0), gpu(1) | {sum(local) / 4:.2f} | {4 * 60000 / sum(local):.0f} | '
        '0.9040 |')


def test_the_seconds_chart_draws_every_rounds_point(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(gm.charts.Animator, 'save', lambda self, path: drawn.append(self))
    results = [make_result('local', [10.0, 10.5, 9.0]), make_result('device', [8.0, 8.2])]
    gm.charts.seconds_chart(str(tmp_path / 'seconds.png'), results)
    assert drawn[0].X == [[1, 2, 3], [1, 2]] and drawn[0].Y == [[10.0, 10.5, 9.0], [8.0, 8.2]]
    assert drawn[0].legend == ['kvstore local', 'kvstore device']


def test_epoch_line():
    record = EpochRecord(2, 0.41234, 0.85, 0.8712, 12.34, 1.0, 60000)
    assert gm.epoch_line(record, 10) == ('epoch 2/10: loss 0.4123, train acc 0.850, '
                                         'test acc 0.871, 12.3 s, 4862 samples/s')


def kvstore_report_text(directory, stats_spread, sync_bn):
    """``report.md`` of two runs whose tracker recorded ``stats_spread`` per epoch."""
    results = [make_result('local', [10.0, 10.5]), make_result('device', [8.0, 8.2])]
    tracker = gm.ParamTracker()
    for r in results:
        for epoch, spread in enumerate(stats_spread, start=1):
            tracker.reference = tracker.reference or r.kvstore
            tracker.diff.setdefault(r.kvstore, []).append(0.0)
            tracker.spread.setdefault(r.kvstore, []).append(0.0)
            tracker.stats_spread.setdefault(r.kvstore, []).append(spread)
    config = {'model': 'resnet18', 'dataset': 'fashion-mnist', 'num_train': 60000,
              'num_test': 10000, 'batch_size': 128, 'lr': 0.1, 'seed': 0, 'sync_bn': sync_bn}
    gm.write_kvstore_report(str(directory), results, tracker, config, 'device is fastest.')
    return (directory / 'report.md').read_text()


def test_the_kvstore_report_says_whether_batchnorm_statistics_were_synchronised(tmp_path):
    plain = kvstore_report_text(tmp_path / 'plain', [2e-3, 3e-3], sync_bn=False)
    assert "BatchNorm's running mean and variance are not synchronised" in plain
    synced = kvstore_report_text(tmp_path / 'synced', [0.0, 0.0], sync_bn=True)
    assert 'not synchronised' not in synced
    assert ("BatchNorm is synchronised: each layer's batch mean and variance are computed over "
            "all devices' shards together, so the running mean and variance are the same on "
            'every device') in synced


@pytest.mark.parametrize('sync_bn', [False, True])
def test_the_kvstore_report_of_a_network_without_batchnorm_says_nothing_of_it(tmp_path, sync_bn):
    text = kvstore_report_text(tmp_path / 'cnn', [None, None], sync_bn=sync_bn)
    assert 'BatchNorm' not in text and 'synchronised' not in text
    assert 'holds the same parameters.\n' in text  # the paragraph ends where it did

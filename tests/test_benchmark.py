"""scripts/benchmark.py: the bookkeeping of its table, and a quick run end to end (no timings)."""
import json
import sys

import pytest

from conftest import REPO, load_script, run_bounded

pytestmark = pytest.mark.slow  # subprocesses or real training: the full suite's


@pytest.fixture(scope='module')
def bench():
    return load_script('benchmark')


def fake_results():
    def ips(*values):
        return [{'images_per_sec': v} for v in values]
    return {
        'train/resnet18/2/device/128/book': ips(20.0, 30.0, 25.0),
        'train/resnet18/2/device/128/ours': ips(50.0, 40.0, 45.0),
        'train/resnet18/1/device/128/ours': ips(50.0),
        'pytorch/resnet18/128': ips(45.0),
        'gemm/1': [{'gflops': 100.0}], 'gemm/2': [{'gflops': 200.0}],
        'pipeline/book': ips(1000.0), 'pipeline/ours': ips(30000.0),
        'e2e/book': [{'epoch_seconds': [10.0, 12.0], 'test_acc': 0.80}],
        'e2e/ours': [{'epoch_seconds': [4.0, 6.0], 'test_acc': 0.795}],
        'memory/book': [{'growth': 0.01, 'peak_mb': 300.0}],
        'memory/ours': [{'growth': 0.08, 'peak_mb': 310.0}, {'error': 'exit 1: boom'}],
    }


def test_summary_takes_medians_and_judges_each_target(bench):
    rows = {r['key']: r for r in bench.summarize(fake_results(), flops_per_image=2e9)}
    assert rows['resnet_speedup']['measured'] == pytest.approx(45.0 / 25.0)
    assert rows['resnet_speedup']['met'] is True           # 1.8 >= 1.8
    assert rows['vs_pytorch']['measured'] == pytest.approx(1.0) and rows['vs_pytorch']['met']
    assert rows['flop_efficiency']['measured'] == pytest.approx(45.0 * 2 / 200.0)
    assert rows['flop_efficiency']['met'] is False
    assert rows['two_vs_one']['measured'] == pytest.approx(0.9) and not rows['two_vs_one']['met']
    assert rows['pipeline']['measured'] == pytest.approx(30.0) and rows['pipeline']['met']
    assert rows['e2e_time']['measured'] == pytest.approx(5.0 / 11.0) and rows['e2e_time']['met']
    assert rows['e2e_accuracy']['measured'] == pytest.approx(0.5) and rows['e2e_accuracy']['met']
    assert rows['memory_growth']['measured'] == pytest.approx(0.08)
    assert rows['memory_growth']['met'] is False
    table = bench.table(list(rows.values()))
    assert table.count('\n') == len(rows) + 1 and '| NO |' in table


def test_missing_figures_are_not_applicable_rather_than_met(bench):
    rows = bench.summarize({'pipeline/ours': [{'images_per_sec': 5.0}]}, 1e9)
    assert all(r['met'] is None for r in rows)


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
    assert '| data pipeline images/s, ours / book-style DataLoader |' in proc.stdout


def test_bad_data_dir_is_one_line_and_status_2(tmp_path):
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'benchmark.py'),
                           '--data-dir', str(tmp_path)])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert 'point --data-dir' in proc.stderr

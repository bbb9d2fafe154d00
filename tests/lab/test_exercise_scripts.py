"""The measuring scripts of the section's exercises, end to end on tiny settings."""
import csv
import json
import os
import re
import sys
import types

import numpy as onp
import pytest

import gluon_multigpu as gm
from gluon_multigpu.base.machine import stamp
from gluon_multigpu.features import precision
from conftest import REPO, load_script, run_bounded


@pytest.mark.slow
def test_balance_measures_every_split_in_every_scenario(tmp_path, capsys):
    balance = load_script('balance')
    out = tmp_path / 'bal'
    assert balance.main(['--cpu-devices', '2', '--steps', '6', '--batch-size', '32',
                         '--rounds', '1', '--scenarios', 'equal', 'shift', '--every', '2',
                         '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((out / 'balance.csv').open()))
    assert [(r['scenario'], r['split']) for r in rows] == [
        (s, n) for s in ('equal', 'shift') for n in ('even', 'weights', 'auto')]
    for r in rows:
        even = next(e for e in rows if e['scenario'] == r['scenario'] and e['split'] == 'even')
        assert float(r['vs_even']) == pytest.approx(float(r['images_per_sec']) /
                                                    float(even['images_per_sec']))
        assert all(0 <= float(i) < 1 for i in r['idle'].split('/'))
        assert sum(map(int, r['shares'].split('/'))) == 32
    assert next(r for r in rows if r['split'] == 'weights')['shares'] == '21/11'  # 2:1 of 32
    assert {r['machine'] for r in rows} == {stamp()['machine']} and rows[0]['date']
    assert (out / 'images.png').stat().st_size > 1000
    assert 'equal: weights ' in printed and 'shift: weights ' in printed
    assert {r['verdict'] for r in rows if r['split'] == 'even'} == {''}  # CSV: empty
    assert all(r['verdict'] in ('faster', 'slower', 'equally fast', 'cannot tell', 'same split')
               for r in rows if r['split'] != 'even')
    assert all(r['vs_even_low'] == '' for r in rows)  # one round: no interval
    assert '| shift | auto |' in (out / 'report.md').read_text()


def test_balance_judges_each_split_against_even_by_the_rounds_it_shares():
    """Known speeds: weights 25% faster than even in every round, auto never moving the
    shares, a load that halves every split's speed from round 3: the answer names weights
    faster with its interval, calls auto the same split, and says the load changed."""
    balance = load_script('balance')
    results = []
    for r in range(1, 5):
        slow = 0.5 if r >= 3 else 1.0
        load = {'load': 1.0, 'others': 1.5 if r >= 3 else 0.1, 'steal': 0.0}
        for i, (name, speed, changes) in enumerate((('even', 1000, 0), ('weights', 1250, 0),
                                                    ('auto', 1010, 0))):
            unit = types.SimpleNamespace(key=f'{r}/busy/{name}')
            wobble = 1 + 0.002 * ((r + i) % 3 - 1)  # each split's own noise
            results.append((unit, {'speed': speed * slow * wobble,
                                   'idle': [0.1, 0.0], 'shares': [128, 128], 'changes': changes,
                                   'undone': 0, 'load': load}))
    rows = balance.summarise(results, 2)
    of = {r['split']: r for r in rows}
    assert of['weights']['verdict'] == 'faster' and of['auto']['verdict'] == 'same split'
    assert of['weights']['vs_even'] == pytest.approx(1.25, rel=0.03)
    assert of['weights']['vs_even_low'] < 1.25 < of['weights']['vs_even_high']
    lines = balance.answers(rows)
    assert re.match(r"busy: weights faster than even \(1\.2\dx even's images/s, 95% interval "
                    r'1\.\d\d-1\.\d\d\); ', lines[0]) and \
        'auto never moved the shares: the same split as even, nothing to compare' in lines[0]
    assert lines[1].startswith('The load changed during the run (other processes used 0.1 to '
                               '1.5 cores')
    # auto that moved the shares and gained nothing is compared, and found equal
    for unit, result in results:
        if unit.key.endswith('/auto'):
            result['changes'] = 2
    auto = next(r for r in balance.summarise(results, 2) if r['split'] == 'auto')
    assert auto['verdict'] == 'equally fast'


def test_balance_refuses_what_it_cannot_measure(capsys):
    balance = load_script('balance')
    assert balance.main(['--cpu-devices', '2', '--weights', '1,2,3']) == 2
    assert '--weights gives 3 weights for 2 devices' in capsys.readouterr().err
    assert balance.main(['--cpu-devices', '1']) == 2
    assert 'at least 2' in capsys.readouterr().err


@pytest.mark.slow
def test_bfloat16_trains_and_is_measured_against_float32(capsys, tmp_path):
    try:  # where the CPU has no bfloat16 kernels, the test below checks the script's answer
        gm.precision.check_bfloat16()
    except gm.DeviceError as e:
        pytest.skip(str(e))
    script = load_script('bfloat16')
    assert script.main(['--models', 'simple-cnn', '--rounds', '1', '--steps', '1', '--results',
                        str(tmp_path / 'kept.json')]) == 0
    table = [l for l in capsys.readouterr().out.splitlines() if l.startswith('| simple-cnn')]
    assert [l.split('|')[3].strip() for l in table] == list(script.VARIANTS)
    speeds = [float(l.split('|')[4]) for l in table]
    assert all(s > 0 for s in speeds), table
    # "vs float32" is each variant's measured images/s over float32's (the table rounds both:
    # the speeds to 0.1 images/s, the ratio to 0.01)
    assert [float(l.split('|')[5]) for l in table] == pytest.approx(
        [s / speeds[0] for s in speeds], abs=0.01), table
    # The claim behind docs/exercises.md: the converted graph trains, in bfloat16 (its
    # loss differs from float32's), with float32 master weights.
    data, _ = gm.data.synthetic_data('fashion-mnist', 64, num_train=64, num_test=64)
    X, y = next(iter(data))
    losses = {}
    for variant in ('float32', 'bfloat16'):
        step = script.steps_of('simple-cnn', variant, X, y)
        losses[variant] = [float(step().mean()) for _ in range(8)]
    assert losses['bfloat16'][-1] < losses['bfloat16'][0]
    assert losses['bfloat16'][0] != losses['float32'][0]
    assert abs(losses['bfloat16'][0] - losses['float32'][0]) < 0.05


def test_bfloat16_json_holds_the_tables_medians_with_the_machine_and_the_date(
        tmp_path, monkeypatch, capsys):
    """--json writes the printed table's figures, stamped (the results file docs/exercises.md
    asks for); the measurement is replaced, so this holds on a CPU without bfloat16 kernels."""
    script = load_script('bfloat16')
    monkeypatch.setattr(precision, 'check_bfloat16', lambda: None)
    monkeypatch.setattr(script, 'warm_steps', lambda args, model, stop: {})
    rounds = iter([(100.0, 50.0, 80.0), (300.0, 90.0, 60.0), (200.0, 70.0, 40.0)])
    monkeypatch.setattr(script, 'measure_round', lambda runs, batch, steps, stop=None,
                        backwards=False: dict(zip(script.VARIANTS, next(rounds))))
    out = tmp_path / 'bfloat16.json'
    assert script.main(['--models', 'simple-cnn', '--rounds', '3', '--results',
                        str(tmp_path / 'rounds.json'), '--json', str(out)]) == 0
    written = json.loads(out.read_text())
    rows = {r['compute']: r for r in written['rows']}
    assert [rows[v]['images_per_s'] for v in script.VARIANTS] == [200.0, 70.0, 60.0]  # medians
    assert rows['bfloat16']['vs_float32'] == pytest.approx(0.35)  # the median of 0.5, 0.3, 0.35
    logs = onp.log([0.5, 0.3, 0.35])
    half = 4.303 * logs.std(ddof=1) / onp.sqrt(3)
    assert (rows['bfloat16']['vs_float32_low'], rows['bfloat16']['vs_float32_high']) == \
        pytest.approx((onp.exp(logs.mean() - half), onp.exp(logs.mean() + half)))
    assert rows['bfloat16']['verdict'] == 'slower' and rows['float32']['verdict'] is None
    assert {r['model'] for r in written['rows']} == {'simple-cnn'}
    assert (written['machine'], written['date']) == (stamp()['machine'], stamp()['date'])
    printed = capsys.readouterr().out
    assert re.search(r'^\| simple-cnn \| 128 \| bfloat16 \| 70\.0 \| 0\.35 \(0\.\d\d-0\.\d\d\) \| '
                     r'slower \|$', printed, re.M), printed
    assert re.search(r'^simple-cnn, bfloat16: 0\.35x \(95% interval 0\.\d\d-0\.\d\d, 3 rounds\): '
                     'slower than float32$', printed, re.M), printed


@pytest.mark.slow
def test_bfloat16_on_a_cpu_without_its_kernels_is_one_line_and_status_2():
    """oneDNN limited to AVX2 (a CPU such as many AMD EPYCs) has no bfloat16 convolution."""
    env = dict(os.environ, DNNL_MAX_CPU_ISA='AVX2', ONEDNN_MAX_CPU_ISA='AVX2')
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'bfloat16.py'), '--models',
                        'simple-cnn', '--rounds', '1', '--steps', '1'], env=env)
    # MXNet's own log lines ("[07:17:02] ../src/operator/...") go to stderr too
    err = [l for l in proc.stderr.splitlines() if not re.match(r'\[\d\d:\d\d:\d\d\] ', l)]
    assert proc.returncode == 2 and proc.stdout == '' and len(err) == 1, proc.stderr
    assert err[0].startswith('error: this CPU cannot compute in bfloat16') and \
        'could not create a primitive descriptor' in err[0], err


def test_inflight_compares_each_k_with_unbounded_in_the_same_rounds(monkeypatch, capsys):
    """Known speeds: K=1 is 10% slower than unbounded, K=2 as fast, and the machine halves all
    speeds from round 3 of 4: K=1 is named slower with its interval, K=2 equally fast, and K=2
    is the smallest within the tolerance."""
    inflight = load_script('inflight')
    calls = []

    def measure(model, k, devices):
        calls.append(k)
        load = 0.5 if len(calls) > 6 else 1.0
        wobble = 1 + 0.005 * (len(calls) % 3 - 1)
        return {1: 90.0, 2: 100.0, 0: 100.0}[k] * load * wobble, 300.0 + k
    monkeypatch.setattr(inflight, 'measure', measure)
    assert inflight.main(['--models', 'simple-cnn', '--values', '1', '2', '0', '--rounds', '4',
                          '--tolerance', '0.02']) == 0
    assert calls == [1, 2, 0, 0, 2, 1, 1, 2, 0, 0, 2, 1]  # every other round backwards
    out = capsys.readouterr().out
    assert re.search(r'^\| 1 \| [\d.]+ \| 0\.9\d\d \(0\.\d{3}-0\.\d{3}\) \| slower \| 301 \|$',
                     out, re.M), out
    assert re.search(r'^\| 2 \| [\d.]+ \| [01]\.\d{3} \([\d.]+-[\d.]+\) \| equally fast \| 302 \|$',
                     out, re.M), out
    assert 'smallest K within 2% of unbounded: 2' in out

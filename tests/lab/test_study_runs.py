"""The measuring programs as long runs: an estimate, results kept as measured, Ctrl-C, --resume,
--data-dir and --download, memory.

scripts/bandwidth.py, scaling.py, balance.py and bfloat16.py share ``lab.studies.sweep``:
every measurement is written to the results file as soon as it is made (marked partial until
the last), a signal is acknowledged at once and keeps what was measured, and ``--resume``
measures only what is missing. Every run here is tiny (real Fashion-MNIST from ../shared).
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import gluon_multigpu as gm
from lab.studies import measure as lab_measure
from lab.studies import scaling_model as lab_scaling
from gluon_multigpu.features import precision
from lab.commands import sweeps
from lab.studies import sweep
from conftest import REPO, load_script

SCRIPTS = REPO / 'scripts'
PROGRAMS = ['bandwidth', 'scaling', 'balance', 'bfloat16']


def tiny(name, data, results):
    """A command line of program ``name`` that measures a few units of a second or two each."""
    argv = {
        'bandwidth': ['--cpu-devices', '2', '--counts', '2', '--models', 'simple-cnn', 'resnet18',
                      '--kvstores', 'local', '--batch-per-device', '1', '--repeats', '3'],
        'scaling': ['--cpu-devices', '2', '--counts', '1', '2', '--model', 'simple-cnn',
                    '--lr-rule', 'linear', 'fixed', '--num-train', '512', '--num-test',
                    '128', '--batch-per-device', '32', '--steps', '8', '--project-to', '2',
                    '--compute-repeats', '1', '--sync-repeats', '1', '--progress-interval', '0',
                    '--out', os.path.join(os.path.dirname(results), 'report')],
        # 2 rounds of 2 scenarios of 3 splits: 12 units (3 rounds, 18, took half again as long;
        # a test below asks for --rounds 1 as other settings than these)
        'balance': ['--cpu-devices', '2', '--steps', '8', '--batch-size', '32', '--rounds', '2',
                    '--scenarios', 'equal', 'busy', '--every', '2'],
        'bfloat16': ['--models', 'simple-cnn', '--rounds', '4', '--steps', '2'],
    }[name]
    return [*argv, '--data-dir', str(data), '--results', str(results)]


def bfloat16_or_skip():
    try:
        gm.precision.check_bfloat16()
    except gm.DeviceError as e:
        pytest.skip(f'this CPU trains no bfloat16: {e}')


def read(path):
    with open(path) as f:
        return json.load(f)


def test_a_run_says_its_estimate_and_keeps_every_measurement(fashion_dir, tmp_path, capsys):
    bandwidth = load_script('bandwidth')
    results = tmp_path / 'bw.json'
    assert bandwidth.main(['--cpu-devices', '4', '--models', 'simple-cnn', '--quick',
                           '--kvstores', 'local', '--data-dir', str(fashion_dir),
                           '--results', str(results)]) == 0
    err = capsys.readouterr().err.splitlines()
    estimates = [l for l in err if l.startswith('estimate: the whole run (2 measurements) takes '
                                                'about ')]
    assert len(estimates) == 1 and 'faster: ' in estimates[0], err
    assert err[-1] == (f'the measurements are kept in {results}: --resume reuses them, '
                       '--overwrite measures again')  # every measuring program says where
    assert [l for l in err if l.startswith('[')] == [
        '[1/2] simple-cnn on 2 cpu devices: compute of 8 per device, then one synchronisation '
        'per kvstore (local), 2 repeats each',
        '[2/2] simple-cnn on 4 cpu devices: compute of 8 per device, then one synchronisation '
        'per kvstore (local), 2 repeats each']
    kept = read(results)
    assert kept['status'] == 'complete' and kept['program'] == 'bandwidth'
    assert [d['key'] for d in kept['done']] == ['simple-cnn/2', 'simple-cnn/4']
    assert [r['devices'] for d in kept['done'] for r in d['result']] == [2, 4]


def interrupt(command, results, cwd, timeout=240):
    """Start ``command`` in a session of its own; SIGINT its group once ``results`` holds a
    measurement; return (status, stdout, stderr)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not (os.path.exists(results) and read(results)['done']):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, 'no measurement kept in time'
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


@pytest.mark.slow  # subprocesses, each measuring
@pytest.mark.parametrize('name', PROGRAMS)
def test_ctrl_c_keeps_what_was_measured_and_resume_measures_only_the_rest(
        name, fashion_dir, tmp_path):
    if name == 'bfloat16':
        bfloat16_or_skip()
    results = tmp_path / 'results.json'
    argv = tiny(name, fashion_dir, results)
    status, out, err = interrupt([sys.executable, str(SCRIPTS / f'{name}.py'), *argv], results,
                                 tmp_path)
    lines = err.splitlines()
    assert status == 130, err
    assert len([l for l in lines if l.startswith('Ctrl-C: stopping after the current step')]) \
        == 1, err
    kept = read(results)
    assert kept['status'] == 'partial' and 0 < len(kept['done']) < kept['total'], kept
    assert lines[-1].startswith(f'interrupted by SIGINT: {len(kept["done"])} of '
                                f'{kept["total"]} measurements in {results} (marked partial); '
                                'continue with: ') and lines[-1].endswith(' --resume'), lines
    assert 'Traceback' not in err
    assert out.startswith('partial results (interrupted): '), out

    # --resume measures only the units not kept, and keeps those as they were
    before = {d['key']: d for d in kept['done']}
    proc = subprocess.run([sys.executable, str(SCRIPTS / f'{name}.py'), *argv, '--resume'],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert f'resuming {results}: {len(before)} of {kept["total"]} measurements are kept' in \
        proc.stderr
    begun = [l for l in proc.stderr.splitlines() if l.startswith('[')]
    assert len(begun) == kept['total'] - len(before), proc.stderr
    done = read(results)
    assert done['status'] == 'complete' and len(done['done']) == done['total']
    for d in done['done']:
        if d['key'] in before:
            assert d == before[d['key']]


def test_a_partial_run_is_not_replaced_without_resume(fashion_dir, tmp_path, capsys):
    balance = load_script('balance')
    results = tmp_path / 'r.json'
    results.write_text(json.dumps({'format': sweep.FORMAT, 'program': 'balance',
                                   'status': 'partial', 'total': 6, 'config': {}, 'done': []}))
    argv = tiny('balance', fashion_dir, results)
    assert balance.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and 'holds a partial run' in err[0] and '--resume' in err[0], err
    # settings other than the run's: refused, naming them
    assert balance.main([*argv, '--rounds', '1', '--resume']) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and 'other settings' in err[0], err
    results.write_text('my notes')  # not a results file: never replaced
    assert balance.main(argv) == 2
    assert 'is not a results file' in capsys.readouterr().err
    assert results.read_text() == 'my notes'


@pytest.mark.parametrize('name', PROGRAMS)
def test_every_program_takes_data_dir_and_download(name, tmp_path, monkeypatch, capsys):
    script = load_script(name)
    if name == 'bfloat16':
        monkeypatch.setattr(precision, 'check_bfloat16', lambda: None)
    fetched = []

    def download(dataset, root, *args, **kwargs):
        fetched.append((dataset, root))
        raise gm.DataError('offline')
    monkeypatch.setattr(gm.data, 'download_dataset', download)
    empty = tmp_path / 'data'
    argv = [a for a in tiny(name, empty, tmp_path / 'r.json') if a != str(empty)]
    argv.remove('--data-dir')
    # Without the files, the one line advises --download, which every program takes.
    assert script.main([*argv, '--data-dir', str(empty)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and '--data-dir' in err[0] and '--download' in err[0], err
    assert script.main([*argv, '--data-dir', str(empty), '--download']) == 2
    assert fetched == [('fashion-mnist', str(empty))]
    assert capsys.readouterr().err.splitlines() == ['error: offline']
    assert not os.path.exists(tmp_path / 'r.json')


@pytest.mark.parametrize('name, argv', [
    ('bandwidth', ['--cpu-devices', '2', '--counts', '2', '--models', 'resnet18',
                   '--batch-per-device', '256']),
    ('scaling', ['--cpu-devices', '2', '--model', 'resnet18', '--batch-per-device', '256']),
    ('balance', ['--cpu-devices', '2', '--model', 'resnet18', '--batch-size', '4096']),
])
def test_what_would_not_fit_in_memory_is_refused_in_one_line(name, argv, fashion_dir, tmp_path,
                                                             monkeypatch, capsys):
    # GLUON_MULTIGPU_MEMORY_AVAILABLE stands for the system's MemAvailable: a 4 GB machine
    monkeypatch.setenv(sweeps.MEMORY_VARIABLE, '4e9')
    script = load_script(name)
    results = tmp_path / 'r.json'
    extra = [] if name == 'balance' else ['--data-dir', str(fashion_dir)]
    out = ['--out', str(tmp_path / 'out')] if name == 'scaling' else []
    assert script.main([*argv, *extra, *out, '--results', str(results)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and 'of memory and 4.0 GB is available' in err[0], err
    assert os.listdir(tmp_path) == []


def test_a_default_too_large_for_the_memory_is_scaled_down_with_a_line(
        fashion_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(sweeps.MEMORY_VARIABLE, '2.5e9')
    bandwidth = load_script('bandwidth')
    measured = []
    monkeypatch.setattr(lab_measure, 'measure_count', lambda model, device_type, n, kvstores,
                        batch, *a, **k: measured.append(batch) or [
                            lab_scaling.bandwidth_row(model, device_type, n, 'local', 10, 40,
                                                     [1.0], [2.0], batch)])
    assert bandwidth.main(['--cpu-devices', '4', '--models', 'resnet18', '--kvstores', 'local',
                           '--data-dir', str(fashion_dir), '--results',
                           str(tmp_path / 'r.json')]) == 0
    notes = [l for l in capsys.readouterr().err.splitlines() if l.startswith('note: ')]
    # 32 per device on 4 contexts: about 2.7 GB (model.MEMORY); 16 per device: 2.3 GB fits
    assert notes == ['note: resnet18 on 4 CPU contexts with a batch of 32 per device would '
                     'need about 2.7 GB of memory and 2.5 GB is available: measuring 16 per '
                     'device instead'], notes
    assert measured == [16, 16]


def test_the_estimate_leaves_out_the_first_measurements_start_up(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(sweep.time, 'monotonic', lambda: clock[0])
    said = []
    units = [sweep.Unit(f'u{i}', f'round {i}') for i in range(5)]
    with sweep.Sweep(str(tmp_path / 'r.json'), 'test', {}, units, said.append,
                     interval=0) as study:
        for unit, seconds in zip(units[:2], (30.0, 10.0)):  # the first one compiles
            study.begin(unit)
            clock[0] += seconds
            study.keep(unit, {'x': 1})
        first, revised = [line for line in said if line.startswith('estimate')]
        assert 'takes about 2 min, about 2 min left' in first  # 5 x 30 s (150 s), 4 x 30 s left
        assert revised.endswith('about 30 s left')  # 3 more at 10 s: the second one's rate
        assert study.left() == pytest.approx(30.0)

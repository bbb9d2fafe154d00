"""The scripts as a hostile user meets them: outputs that cannot be written, signals, full disks.

Every script checks its outputs before it measures, ends on SIGINT or SIGTERM
with one line and status 130 or 143 (no traceback, no half-written file, no
child process left running), and writes a report folder all or nothing; a
chart's format follows its name's extension.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import gluon_multigpu as gm
from lab.commands import sweeps
from lab.studies import measure as lab_measure
from lab.studies import scaling_model as lab_scaling
from lab.studies import scaling_report as lab_scaling_report
from lab.studies import sweep as lab_sweep
from gluon_multigpu.section.results import EpochRecord, TrainResult
from process_state import Load
from conftest import REPO, Lines, alive, children, load_script, run_bounded, wait_bounded

SCRIPTS = REPO / 'scripts'
PNG, SVG, PDF = b'\x89PNG\r\n\x1a\n', b'<?xml', b'%PDF'


class SignalLeaked(Exception):
    """A signal reached the test process: the code under test did not handle it."""


@pytest.fixture
def signal_guard():
    """SIGINT and SIGTERM raise ``SignalLeaked`` here unless the code under test takes them.

    Without it, a script that does not handle a signal it is sent in-process
    would end pytest (SIGTERM) or stop the whole session (SIGINT).
    """
    def leaked(signum, frame):  # pylint: disable=unused-argument
        raise SignalLeaked(signal.Signals(signum).name)
    previous = {s: signal.signal(s, leaked) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


def send_self(signum):
    """Send ``signum`` to this process's main thread; its handler runs at the next bytecode."""
    signal.pthread_kill(threading.main_thread().ident, signum)
    for _ in range(500):  # a deadline of 5 s, not a timing: the handler raises out of it
        time.sleep(0.01)
    raise AssertionError(f'{signal.Signals(signum).name} was not acted on')


def not_measured(*args, **kwargs):
    raise AssertionError('measured before the outputs were checked')


# --- 1. every output is checked before any measurement -------------------------------------

def output_cases(tmp_path, unwritable_dir):
    """(path, what the one line says) for a file output no one can write."""
    (tmp_path / 'a-dir').mkdir()
    return [(str(tmp_path / 'a-dir'), 'is a directory; give a file name'),
            (str(tmp_path / 'no' / 'such' / 'x.json'), 'does not exist; create it first'),
            (os.path.join(unwritable_dir, 'x.json'), str(unwritable_dir))]


def patched(module, path):
    """What ``path`` (``name``, ``lab_measure.name``) patches: the program, or the lab's
    ``measure``."""
    owner = path.rpartition('.')[0]
    return {'lab_measure': lab_measure}[owner] if owner else module


@pytest.mark.parametrize('script, argv, patch', [
    ('inflight', ['--models', 'simple-cnn', '--values', '1', '--rounds', '1', '--json'],
     'measure'),
    ('benchmark', ['--quick', '--repeats', '1', '--only', 'gemm/1', '--data-dir', '{data}',
                   '--json'], 'run_task'),
    ('bandwidth', ['--cpu-devices', '2', '--quick', '--models', 'simple-cnn', '--data-dir',
                   '{data}', '--csv'], 'lab_measure.measure_bandwidth'),
])
def test_a_file_output_that_cannot_be_written_stops_before_measuring(
        script, argv, patch, tmp_path, unwritable_dir, fashion_dir, monkeypatch, capsys):
    module = load_script(script)
    monkeypatch.setattr(patched(module, patch), patch.rpartition('.')[2], not_measured)
    cases = output_cases(tmp_path, unwritable_dir)
    before = sorted(os.listdir(tmp_path))
    argv = [a.format(data=fashion_dir) for a in argv]
    for path, message in cases:
        status = module.main([*argv, path])
        captured = capsys.readouterr()
        assert status == 2, (path, captured.err)
        assert len(captured.err.splitlines()) == 1 and message in captured.err, captured.err
        assert captured.out == '' and 'Traceback' not in captured.err
        assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize('script, argv, patch', [
    ('scaling', ['--cpu-devices', '2', '--model', 'simple-cnn', '--out'], 'lab_measure.run_sweep'),
    ('balance', ['--cpu-devices', '2', '--out'], 'measure_all'),
])
def test_a_folder_output_that_cannot_be_written_stops_before_measuring(
        script, argv, patch, tmp_path, unwritable_dir, monkeypatch, capsys):
    module = load_script(script)
    monkeypatch.setattr(patched(module, patch), patch.rpartition('.')[2], not_measured)
    (tmp_path / 'a-file').write_text('mine')
    for path, message in [(tmp_path / 'a-file', 'is a file; give a directory'),
                          (tmp_path / 'no' / 'such', 'does not exist; create it first'),
                          (os.path.join(unwritable_dir, 'out'), str(unwritable_dir))]:
        status = module.main([*argv, str(path)])
        captured = capsys.readouterr()
        assert status == 2 and len(captured.err.splitlines()) == 1, captured.err
        assert message in captured.err and 'Traceback' not in captured.err
        assert os.listdir(tmp_path) == ['a-file']


def test_csv_and_json_naming_the_same_file_is_refused(tmp_path, monkeypatch, capsys):
    bandwidth = load_script('bandwidth')
    monkeypatch.setattr(lab_measure, 'measure_bandwidth', not_measured)
    same = str(tmp_path / 'bw')
    assert bandwidth.main(['--cpu-devices', '2', '--csv', same, '--json', f'{tmp_path}/./bw']) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and '--csv and --json name the same place' in err
    assert os.listdir(tmp_path) == []


# --- 1. Ctrl-C and SIGTERM: one line, 130 or 143, nothing half-written, no process left -----

class Output:
    """Both output streams of a process, read by threads, line by line."""

    def __init__(self, proc):
        self.lines = {'out': [], 'err': []}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                         for name, stream in (('out', proc.stdout), ('err', proc.stderr))]
        for t in self._threads:
            t.start()

    def _read(self, name, stream):
        for line in stream:
            with self._lock:
                self.lines[name].append(line.rstrip('\n'))

    def snapshot(self):
        with self._lock:
            return {k: list(v) for k, v in self.lines.items()}

    def all(self, timeout=30):
        """Every line, once both streams have ended (after the process)."""
        for t in self._threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self._threads), 'output still open after the end'
        return self.snapshot()


def first_line(lines, kids):  # pylint: disable=unused-argument
    return lines['out'] or lines['err']


def running_child(lines, kids):  # pylint: disable=unused-argument
    return kids


def stop_after(command, signum, cwd, ready=first_line, timeout=240):
    """Start ``command``, send ``signum`` once ``ready(lines, children)``; return what it did.

    Returns ``(status, stdout lines, stderr lines, child processes seen)``.
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd)
    try:
        output, seen = Output(proc), set()
        deadline = time.monotonic() + timeout
        while True:
            kids = children(proc.pid)
            seen.update(kids)
            if ready(output.snapshot(), kids):
                break
            assert proc.poll() is None, f'the process ended first: {output.all()}'
            assert time.monotonic() < deadline, f'not ready in {timeout} s: {output.snapshot()}'
            time.sleep(0.05)
        proc.send_signal(signum)
        status = wait_bounded(proc, Load().room(120))  # 120 s on a quiet machine, scaled
    finally:
        proc.kill()
    lines = output.all()
    return status, lines['out'], lines['err'], seen


def every_file(folder):
    """Every file and folder under ``folder`` (hidden ones too), as paths relative to it."""
    found = []
    for root, dirs, names in os.walk(folder):
        found += [os.path.relpath(os.path.join(root, n), folder) for n in dirs + names]
    return sorted(found)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def kept_a_measurement(path):
    """A ``ready`` for ``stop_after``: the results file ``path`` holds a measurement."""
    def ready(lines, kids):  # pylint: disable=unused-argument
        return os.path.exists(path) and bool(read_json(path)['done'])  # replaced atomically
    return ready


def acknowledged(err, signum):
    """The lines acknowledging ``signum`` (said at once, before the current step ends)."""
    name = 'Ctrl-C' if signum == signal.SIGINT else signal.Signals(signum).name
    return [l for l in err if l.startswith(f'{name}: stopping after the current step')]


#: (script, its arguments, the results file they keep, the signal): each measurement takes a
#: second or two, and there are many.
SWEEPS = [
    ('bandwidth', ['--cpu-devices', '3', '--counts', '2', '3', '--models', 'simple-cnn',
                   'resnet18', '--kvstores', 'local', 'device', '--batch-per-device', '1',
                   '--repeats', '20', '--csv', 'bw.csv', '--json', 'bw.json'],
     'bandwidth-results.json', signal.SIGTERM),
    ('scaling', ['--full', '--cpu-devices', '2', '--counts', '1', '2', '--model', 'simple-cnn',
                 '--lr-rule', 'linear', 'sqrt', 'fixed', '--num-epochs', '3', '--num-train',
                 '256', '--num-test', '64', '--batch-per-device', '32', '--progress-interval',
                 '0', '--out', 'sweep'], os.path.join('sweep', 'results.json'), signal.SIGINT),
    ('balance', ['--cpu-devices', '2', '--steps', '40', '--batch-size', '32', '--rounds', '20',
                 '--out', 'bal'], os.path.join('bal', 'results.json'), signal.SIGTERM),
    ('bfloat16', ['--models', 'simple-cnn', '--rounds', '100', '--steps', '5'],
     'bfloat16-results.json', signal.SIGINT),
]


def skip_without_bfloat16(script):
    if script == 'bfloat16':
        try:
            gm.precision.check_bfloat16()
        except gm.DeviceError as e:  # the script refuses such a CPU at once: nothing to stop
            pytest.skip(f'this CPU trains no bfloat16: {e}')


@pytest.mark.slow
@pytest.mark.parametrize('script, argv, results, signum', SWEEPS)
def test_a_signal_after_a_measurement_is_acknowledged_and_keeps_only_the_results_file(
        script, argv, results, signum, fashion_dir, tmp_path):
    skip_without_bfloat16(script)
    extra = [] if script in ('balance', 'bfloat16') else ['--data-dir', str(fashion_dir)]
    status, out, err, _ = stop_after([sys.executable, str(SCRIPTS / f'{script}.py'), *argv,
                                      *extra], signum, tmp_path,
                                     ready=kept_a_measurement(tmp_path / results))
    name = signal.Signals(signum).name
    assert status == 128 + signum, (status, err)
    assert len(acknowledged(err, signum)) == 1, err
    assert not any('Traceback' in line or 'while starting' in line for line in err), err
    kept = read_json(tmp_path / results)
    assert kept['status'] == 'partial' and 0 < len(kept['done']) < kept['total'], kept
    assert err[-1].startswith(f'interrupted by {name}: {len(kept["done"])} of {kept["total"]} '
                              f'measurements in {results} (marked partial); continue with: '), err
    assert err[-1].endswith(' --resume'), err
    assert out[0].startswith('partial results (interrupted): '), out
    # Nothing else: no report, no --csv or --json, no temporary or lock file, no empty folder.
    assert every_file(tmp_path) == sorted({results, os.path.dirname(results)} - {''})


@pytest.mark.slow
@pytest.mark.parametrize('script, argv, signum', [
    # The first line names the first measurement, a long one: the signal comes in the middle.
    ('scaling', ['--full', '--cpu-devices', '2', '--counts', '2', '--model', 'simple-cnn',
                 '--num-epochs', '1000', '--num-train', '256', '--num-test', '64',
                 '--batch-per-device', '32', '--progress-interval', '0', '--out', 'sweep'],
     signal.SIGINT),
    ('bfloat16', ['--models', 'resnet18', '--rounds', '3', '--steps', '50'], signal.SIGTERM),
])
def test_a_signal_before_the_first_measurement_ends_leaves_nothing(script, argv, signum,
                                                                   fashion_dir, tmp_path):
    skip_without_bfloat16(script)
    extra = [] if script == 'bfloat16' else ['--data-dir', str(fashion_dir)]
    status, _, err, _ = stop_after([sys.executable, str(SCRIPTS / f'{script}.py'), *argv,
                                    *extra], signum, tmp_path,
                                   ready=lambda lines, kids: lines['err'])
    assert status == 128 + signum, (status, err)
    assert len(acknowledged(err, signum)) == 1, err
    assert err[-1].startswith(f'interrupted by {signal.Signals(signum).name}: ') and \
        err[-1].endswith('nothing was written'), err
    # Not even the --out folder the run made at its start, nor the results file's lock file.
    assert os.listdir(tmp_path) == []


def assert_stopped(status, err, signum, seen=()):
    name = signal.Signals(signum).name
    assert status == 128 + signum, (status, err)
    assert err[-1] == f'interrupted by {name}: nothing was written', err
    assert not any('Traceback' in line or 'while starting' in line for line in err), err
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in seen if alive(pid)], 'child processes outlived the script'


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_inflights_run_in_progress_and_leaves_none(signum, tmp_path):
    # A measured run is a child process; the signal comes while it trains.
    status, _, err, seen = stop_after(
        [sys.executable, str(SCRIPTS / 'inflight.py'), '--models', 'resnet18', '--values', '1',
         '--json', 'k.json'], signum, tmp_path, ready=running_child)
    assert_stopped(status, err, signum, seen)
    assert seen and os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_signal_stops_the_benchmarks_measurement_in_progress_and_leaves_none(
        fashion_dir, tmp_path):
    status, _, err, seen = stop_after(
        [sys.executable, str(SCRIPTS / 'benchmark.py'), '--quick', '--repeats', '100', '--only',
         'gemm', '--data-dir', str(fashion_dir), '--json', 'b.json'], signal.SIGTERM, tmp_path,
        ready=running_child)
    assert_stopped(status, err, signal.SIGTERM, seen)
    assert seen and os.listdir(tmp_path) == []


def test_a_signal_while_the_demo_runs_is_one_line(signal_guard, monkeypatch, capsys):
    demo = load_script('demo')
    monkeypatch.setattr(demo, 'walk_through', lambda devices, out: send_self(signal.SIGTERM))
    assert demo.main(['--cpu']) == 143
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('interrupted by SIGTERM: ') and \
        'nothing was written' in err, err
    # Afterwards the handlers are the caller's again.
    with pytest.raises(SignalLeaked):
        send_self(signal.SIGTERM)


def made_up_scaling_run(monkeypatch):
    """Patch scaling's training to one made-up run on 8 synthetic images: nothing is trained."""
    row = dict.fromkeys(lab_scaling.MEASURED_COLUMNS)
    row.update(kind='measured', model='simple-cnn', device_type='cpu', devices=1,
               kvstore='device', batch_mode='per-device', batch_size=32, per_device_batch=32,
               lr_rule='linear', lr=0.1, epochs=1, samples_per_sec=100.0, test_acc=0.5,
               status='ok')
    monkeypatch.setattr(gm.data, 'load_data', lambda *a, **k: gm.data.synthetic_data(
        'fashion-mnist', 1, num_train=8, num_test=8))
    monkeypatch.setattr(lab_measure, 'train_config', lambda *a, **k: dict(row))
    monkeypatch.setattr(lab_measure, 'measure_projection', lambda *a, **k: ([], []))


SCALING_REPORT = ['accuracy.png', 'efficiency.png', 'projection.csv', 'report.md',
                  'results.json', 'scaling.csv', 'speedup.png', 'sync.csv']


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_writing_the_report_lets_it_finish(signum, tmp_path, signal_guard,
                                                          monkeypatch, capsys):
    scaling = load_script('scaling')
    made_up_scaling_run(monkeypatch)
    chart = lab_scaling_report.accuracy_batch_chart

    heard, words = threading.Event(), sweeps.sweep_heard

    def saying(signum):  # what the stop request's reader thread prints, at once
        heard.set()
        return words(signum)
    monkeypatch.setattr(sweeps, 'sweep_heard', saying)

    def signalled(*args, **kwargs):  # the signal comes while a chart of the report is drawn
        signal.pthread_kill(threading.main_thread().ident, signum)
        assert heard.wait(30), 'the signal was not acknowledged'
        return chart(*args, **kwargs)
    monkeypatch.setattr(lab_scaling_report, 'accuracy_batch_chart', signalled)
    out = tmp_path / 'sweep'
    assert scaling.main(['--full', '--cpu-devices', '1', '--model', 'simple-cnn', '--out',
                         str(out)]) == \
        128 + signum
    err = capsys.readouterr().err.splitlines()
    name = signal.Signals(signum).name
    assert len(acknowledged(err, signum)) == 1, err
    assert err[-1].startswith(f'{name} came after the last measurement: ') and \
        'complete and written' in err[-1] and f'exit status {128 + signum}' in err[-1], err
    # The report is whole (no staging folder, no temporary file, no lock file left).
    assert every_file(tmp_path) == ['sweep'] + [f'sweep{os.sep}{n}' for n in SCALING_REPORT]
    assert read_json(out / 'results.json')['status'] == 'complete'
    assert (out / 'accuracy.png').read_bytes().startswith(PNG)  # the chart drawn at the signal
    assert (out / 'report.md').read_text().startswith('#')  # written after it
    # Afterwards the handlers are the caller's again.
    with pytest.raises(SignalLeaked):
        send_self(signum)


# --- 1. the results file of a measuring run, as a hostile user meets it --------------------

BALANCE = ['--cpu-devices', '2', '--steps', '8', '--batch-size', '32', '--rounds', '20',
           '--scenarios', 'equal', 'busy', '--every', '2']


def one_line(capsys, *wanted):
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and all(w in err[0] for w in wanted), err
    assert 'Traceback' not in err[0]
    return err[0]


@pytest.mark.slow
def test_a_second_run_on_the_same_results_file_is_refused_and_sigkill_leaves_it_whole(
        tmp_path, monkeypatch, capsys):
    balance = load_script('balance')
    results = tmp_path / 'r.json'
    argv = [*BALANCE, '--results', str(results)]
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / 'balance.py'), *argv], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (results.exists() and read_json(results)['done']):
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            time.sleep(0.05)
        # A second run, while the first measures: one line, 2, before it measures anything.
        monkeypatch.setattr(balance, 'run_once', not_measured)
        for again in ([], ['--resume']):
            assert balance.main([*argv, *again]) == 2
            one_line(capsys, f'another run (process {proc.pid}) is writing {results}; wait')
        assert proc.poll() is None, 'the first run ended: the test proves nothing'
        proc.send_signal(signal.SIGKILL)  # in the middle: no handler, no cleanup
        assert wait_bounded(proc, 30) == -signal.SIGKILL
    finally:
        proc.kill()
    kept = read_json(results)  # whole: every write replaced it atomically
    assert kept['status'] == 'partial' and 0 < len(kept['done']) < kept['total']
    # The lock the killed run held went with it: the next run takes its lock file over.
    assert (tmp_path / '.r.json.lock').exists()
    units = [lab_sweep.Unit(d['key'], d['label']) for d in kept['done']] + [lab_sweep.Unit('x', 'x')]
    with lab_sweep.Sweep(str(results), 'balance', kept['config'], units, lambda line: None,
                        resume=True, interval=0) as again:
        assert again.resumed == len(kept['done'])
    assert every_file(tmp_path) == ['r.json']


def test_a_results_file_that_is_a_link_is_written_through_or_refused(tmp_path, monkeypatch,
                                                                    capsys):
    balance = load_script('balance')
    monkeypatch.setattr(balance, 'run_once', not_measured)
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    (elsewhere / 'notes.txt').write_text('mine')
    link = tmp_path / 'r.json'
    # To a file that is not a results file: never replaced.
    link.symlink_to(elsewhere / 'notes.txt')
    assert balance.main([*BALANCE, '--results', str(link)]) == 2
    one_line(capsys, f'{link} is not a results file of balance')
    # Into the kernel's files (standard output): refused.
    link.unlink()
    link.symlink_to('/proc/self/fd/1')
    assert balance.main([*BALANCE, '--results', str(link)]) == 2
    one_line(capsys, '--results', 'is in proc')
    assert (elsewhere / 'notes.txt').read_text() == 'mine' and link.is_symlink()
    assert sorted(os.listdir(elsewhere)) == ['notes.txt']
    # To a new file elsewhere: that file is written (and locked), the link stays.
    link.unlink()
    link.symlink_to(elsewhere / 'kept.json')
    unit = lab_sweep.Unit('a', 'a')
    with lab_sweep.Sweep(str(link), 'balance', {}, [unit, lab_sweep.Unit('b', 'b')],
                        lambda line: None, interval=0) as kept:
        assert sorted(os.listdir(elsewhere)) == ['.kept.json.lock', 'notes.txt']
        with pytest.raises(lab_sweep.SweepError, match='another run'):
            lab_sweep.Sweep(str(elsewhere / 'kept.json'), 'balance', {}, [unit], print)
        kept.begin(unit)
        kept.keep(unit, 1)
    assert link.is_symlink() and read_json(elsewhere / 'kept.json')['done'][0]['result'] == 1
    assert sorted(os.listdir(elsewhere)) == ['kept.json', 'notes.txt']


def test_a_default_results_file_that_cannot_be_written_stops_before_measuring(
        tmp_path, unwritable_dir, monkeypatch, capsys):
    balance = load_script('balance')
    monkeypatch.setattr(balance, 'run_once', not_measured)
    # balance-results.json in the current folder, which is not writable
    monkeypatch.chdir(unwritable_dir)
    assert balance.main(BALANCE) == 2
    one_line(capsys, '--results', 'balance-results.json', 'cannot create files in')
    # a pipe in its place (reading it would wait for a writer forever)
    monkeypatch.chdir(tmp_path)
    os.mkfifo('balance-results.json')
    assert balance.main(BALANCE) == 2
    one_line(capsys, 'exists and is not a regular file')
    # --out's folder is made for it, and removed again when nothing was measured
    os.remove('balance-results.json')
    assert balance.main([*BALANCE, '--out', 'no/such']) == 2
    one_line(capsys, '--out', 'does not exist; create it first')
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('content', [
    b'', b'{"format": "gluon-multigpu sweep results 1", "program": "bal',
    b'\x89PNG\r\n\x1a\n\x00\xff', b'[1, 2, 3]', b'[' * 100000,
    b'{"format": "gluon-multigpu sweep results 1", "program": "balance", "status": "partial", '
    b'"total": 120, "config": {}, "done": [{"key": 3, "result": 1}]}',
    b'{"format": "gluon-multigpu sweep results 1", "program": "balance", "status": "partial", '
    b'"total": 120, "config": {}, "done": ["1/equal/even"]}',
])
def test_a_corrupt_results_file_with_resume_is_one_line_and_left_as_it_was(
        content, tmp_path, monkeypatch, capsys):
    balance = load_script('balance')
    monkeypatch.setattr(balance, 'run_once', not_measured)
    results = tmp_path / 'r.json'
    results.write_bytes(content)
    for again in (['--resume'], []):
        assert balance.main([*BALANCE, '--results', str(results), *again]) == 2
        one_line(capsys, f'{results} is not a results file of balance')
    assert results.read_bytes() == content and os.listdir(tmp_path) == ['r.json']


def test_a_results_file_in_the_out_folder_may_take_any_name_but_a_reports(
        tmp_path, signal_guard, monkeypatch, capsys):
    scaling = load_script('scaling')
    made_up_scaling_run(monkeypatch)
    out = tmp_path / 'sweep'
    argv = ['--full', '--cpu-devices', '1', '--model', 'simple-cnn', '--out', str(out)]
    assert scaling.main([*argv, '--results', str(out / 'report.md')]) == 2
    one_line(capsys, f'--results {out / "report.md"} takes the name of a file of the report')
    assert os.listdir(tmp_path) == []
    # The default, given: as without it.
    assert scaling.main([*argv, '--results', str(out / 'results.json')]) == 0
    assert sorted(os.listdir(out)) == SCALING_REPORT


#: A measuring program whose second measurement is a single step of 3 s: a second Ctrl-C
#: comes while it runs.
SLOW_STEP = """\
import sys, time
import gluon_multigpu as gm
from lab.commands import common, sweeps
from lab.studies import sweep as lab_sweep

def build():
    p = common.OneLineParser()
    common.add_sweep_flags(p, 'r.json')
    return p

def run(args, stop=None):
    sweep = lab_sweep.Sweep(args.results, 'slow', {}, [lab_sweep.Unit(str(i), f'unit {i}')
                                                        for i in range(4)], common.say_quietly)
    def measure(unit):
        print('measuring', unit.key, flush=True)
        time.sleep(0 if unit.key == '0' else 3)
        return int(unit.key)
    sweeps.measure_sweep(sweep, measure, stop, lambda results: print('partial:', results))

sys.exit(sweeps.sweep_main(sys.argv[1:], build, run, 'slow'))
"""


@pytest.mark.slow
@pytest.mark.parametrize("gap, second", [(0, False), (1.0, True)])
def test_ctrl_c_twice(gap, second, tmp_path):
    # Within half a second: the same Ctrl-C (delivered twice); after: stop now.
    program = tmp_path / 'slow.py'
    program.write_text(SLOW_STEP)
    results = tmp_path / 'r.json'
    proc = subprocess.Popen([sys.executable, str(program), '--results', str(results)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        lines = Lines(proc.stdout)
        lines.wait_for(r'^measuring 1$', timeout=60)  # in the second measurement's step
        proc.send_signal(signal.SIGINT)
        time.sleep(gap)  # the gap between the two Ctrl-C is what the test is about
        proc.send_signal(signal.SIGINT)
        wait_bounded(proc, 30)
        err = proc.stderr.read()
    finally:
        proc.kill()
    lines.wait_ended()  # the reader has read every line the program wrote
    out = '\n'.join(l for l in lines.text() if not l.startswith('measuring '))
    err = err.splitlines()
    assert proc.returncode == 130 and 'Traceback' not in '\n'.join(err), err
    assert len(acknowledged(err, signal.SIGINT)) == 1, err
    if second:
        assert err[-1].startswith('stopped at once (a second signal): ') and \
            f'1 of 4 measurements in {results}' in err[-1] and 'partial' in err[-1], err
        assert out == ''
    else:
        # The step in progress ends, and its measurement is kept.
        assert err[-1].startswith(f'interrupted by SIGINT: 2 of 4 measurements in {results} '
                                  '(marked partial); continue with: '), err
        assert out.startswith('partial:')  # the program's partial table
    kept = read_json(results)
    assert kept['status'] == 'partial'
    assert [d['result'] for d in kept['done']] == ([0] if second else [0, 1])
    assert every_file(tmp_path) == ['r.json', 'slow.py']  # no lock file, no temporary file


# --- 2. report folders all or nothing, a full disk named ------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs, unmounted afterwards; skipped where mounting is not permitted."""
    mount = tmp_path / 'disk'
    mount.mkdir()
    try:
        proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', str(mount)],
                              capture_output=True, text=True, timeout=30, check=False)
        why = proc.stderr.strip() if proc.returncode else None
    except OSError as e:  # no mount program
        why = str(e)
    if why is not None:
        pytest.skip(f'cannot mount a small tmpfs here (needs root and mount): {why}')
    try:
        yield mount
    finally:
        # Lazily if a file there is still open (a failed write's, until collected): detached now.
        if subprocess.run(['umount', str(mount)], capture_output=True, timeout=30,
                          check=False).returncode:
            subprocess.run(['umount', '-l', str(mount)], capture_output=True, timeout=30,
                           check=False)


def fill(disk, leave):
    """Fill ``disk`` but ``leave`` bytes (in whole pages) with a file of our own; return it."""
    stat = os.statvfs(disk)
    filler = disk / 'filler'
    filler.write_bytes(b'x' * max(0, stat.f_bavail * stat.f_frsize - leave))
    return filler


def make_result(kvstore, seconds):
    result = TrainResult(devices=['cpu(0)', 'cpu(1)'], kvstore=kvstore, lr=0.2)
    for i, s in enumerate(seconds, start=1):
        result.epochs.append(EpochRecord(i, 0.5, 0.8, 0.8 + i / 100, s, 1.0, 60000))
    return result


def kvstore_report(directory):
    results = [make_result('local', [10.0, 10.5]), make_result('device', [8.0, 8.2])]
    tracker = gm.ParamTracker()
    tracker.reference = 'local'
    config = {'model': 'simple-cnn', 'dataset': 'fashion-mnist', 'num_train': 60000,
              'num_test': 10000, 'batch_size': 128, 'lr': 0.3, 'seed': 0}
    gm.write_kvstore_report(str(directory), results, tracker, config, 'device is fastest.')


REPORT = ['accuracy.png', 'report.md', 'runs.json', 'seconds.png']


def test_a_kvstore_report_on_a_full_disk_leaves_nothing_and_names_the_file(small_disk, tmp_path):
    kvstore_report(tmp_path / 'whole')
    assert sorted(os.listdir(tmp_path / 'whole')) == REPORT
    # Room for the first chart only: the call fails part-way.
    first = (tmp_path / 'whole' / 'accuracy.png').stat().st_size
    filler = fill(small_disk, -(-first // 4096) * 4096 + 4096)
    with pytest.raises(OSError) as failed:
        kvstore_report(small_disk / 'report')
    assert failed.value.filename in [str(small_disk / 'report' / n) for n in REPORT]
    assert failed.value.filename != str(small_disk / 'report' / 'accuracy.png')
    assert os.listdir(small_disk) == ['filler'] and filler.stat().st_size > 0


def test_a_failed_report_leaves_the_folder_and_its_old_report_as_they_were(small_disk):
    folder = small_disk / 'report'
    folder.mkdir()
    (folder / 'notes.txt').write_text('mine')
    (folder / 'report.md').write_text('the last report')
    fill(small_disk, 4096)
    with pytest.raises(OSError) as failed:
        kvstore_report(folder)
    assert failed.value.errno == 28 and failed.value.filename.startswith(str(folder))
    assert sorted(os.listdir(folder)) == ['notes.txt', 'report.md']
    assert (folder / 'report.md').read_text() == 'the last report'


def test_an_interrupted_report_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise gm.Interrupted.by_signal(signal.SIGINT)
    monkeypatch.setattr(gm.kvstore_report, 'seconds_chart', interrupted)
    with pytest.raises(gm.Interrupted):
        kvstore_report(tmp_path / 'new' / 'report')
    assert os.listdir(tmp_path) == []


def test_a_report_whose_last_move_fails_takes_back_the_files_it_moved(tmp_path, monkeypatch):
    folder, replace = tmp_path / 'report', os.replace

    def failing(src, dst):
        if os.path.basename(dst) == 'runs.json' and os.path.dirname(dst) == str(folder):
            raise OSError(28, 'No space left on device', src, dst)
        replace(src, dst)
    monkeypatch.setattr(os, 'replace', failing)
    with pytest.raises(OSError) as failed:
        kvstore_report(folder)
    assert failed.value.filename == str(folder / 'runs.json') and failed.value.filename2 is None
    assert str(failed.value) == f"[Errno 28] No space left on device: '{folder / 'runs.json'}'"
    assert os.listdir(tmp_path) == []


def test_a_chart_on_a_full_disk_names_its_file(small_disk):
    fill(small_disk, 0)
    path = small_disk / 'acc.png'
    with pytest.raises(OSError) as failed:
        gm.charts.accuracy_chart(str(path), [make_result('device', [1.0, 1.0])])
    assert failed.value.errno == 28 and failed.value.filename == str(path)
    assert os.listdir(small_disk) == ['filler']


def test_scaling_outputs_on_a_full_disk_leave_nothing_and_name_the_file(small_disk):
    rows = [dict(dict.fromkeys(lab_scaling.MEASURED_COLUMNS), devices=1, kvstore='device',
                 batch_mode='per-device', batch_size=32, per_device_batch=32, lr_rule='linear',
                 lr=0.1, samples_per_sec=100.0, test_acc=0.5, status='ok', epochs=1)]
    config = {'model': 'simple-cnn', 'device_type': 'cpu', 'dataset': 'fashion-mnist',
              'num_train': 8, 'num_test': 8, 'epochs': 1, 'seed': 0, 'counts': [1],
              'base_lr': 0.1, 'engine': 'test', 'project_to': 1, 'compute_repeats': 1,
              'sync_repeats': 1}
    fill(small_disk, 8192)
    with pytest.raises(OSError) as failed:
        lab_scaling_report.write_scaling_outputs(small_disk / 'sweep', config, rows, [], [])
    assert failed.value.errno == 28
    assert os.path.dirname(failed.value.filename) == str(small_disk / 'sweep')
    assert os.listdir(small_disk) == ['filler']


def test_balance_outputs_on_a_full_disk_leave_nothing(small_disk):
    balance = load_script('balance')
    rows = [{'scenario': 'equal', 'split': s, 'images_per_sec': 100.0, 'vs_even': 1.0,
             'idle': [0.1, 0.2], 'shares': [16, 16], 'changes': 0, 'undone': 0,
             'rounds': [100.0]} for s in balance.SPLITS]
    fill(small_disk, 4096)
    with pytest.raises(OSError) as failed:
        balance.write_outputs(str(small_disk / 'bal'), rows, ['cpu(0)', 'cpu(1)'],
                              {'model': 'simple-cnn', 'batch': 32, 'command': 'balance.py'})
    assert failed.value.errno == 28 and failed.value.filename.startswith(str(small_disk / 'bal'))
    assert os.listdir(small_disk) == ['filler']


@pytest.mark.slow
def test_a_sweep_whose_report_does_not_fit_is_one_line_and_status_1(small_disk, fashion_dir):
    fill(small_disk, 12288)  # a page each for the results file, its temporary and --out's lock
    proc = run_bounded([sys.executable, str(SCRIPTS / 'scaling.py'), '--cpu-devices', '1',
                        '--model', 'simple-cnn', '--num-epochs', '1', '--num-train', '64',
                        '--num-test', '32', '--batch-per-device', '32', '--compute-repeats', '1',
                        '--sync-repeats', '1', '--rounds', '1', '--progress-interval', '0',
                        '--data-dir', str(fashion_dir), '--out', str(small_disk / 'sweep')])
    err = proc.stderr.splitlines()
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr
    assert err[-1].startswith(f'error: could not write {small_disk}/sweep/') and \
        'No space left on device' in err[-1] and \
        'the results file keeps what was measured before' in err[-1], err[-1]
    assert '| devices |' in proc.stdout  # the figures are shown all the same
    # no part of the report: only the results file, whole, for --resume to write it again
    assert sorted(os.listdir(small_disk)) == ['filler', 'sweep']
    assert os.listdir(small_disk / 'sweep') == ['results.json']
    kept = json.loads((small_disk / 'sweep' / 'results.json').read_text())
    assert kept['status'] == 'complete' and len(kept['done']) == 1, kept


# --- 3. a chart's format follows its extension --------------------------------------------

@pytest.mark.parametrize('name, magic', [('acc.png', PNG), ('acc.svg', SVG), ('acc.pdf', PDF),
                                         ('ACC.SVG', SVG)])
def test_charts_are_written_in_the_format_their_extension_names(name, magic, tmp_path):
    results = [make_result('local', [1.0, 1.1]), make_result('device', [0.9, 1.0])]
    assert gm.charts.check_chart_path(name, '--plot') == name.rsplit('.', 1)[1].lower()
    gm.charts.accuracy_chart(str(tmp_path / name), results)
    gm.bar_chart(str(tmp_path / f'bars-{name}'), ['a', 'b'], [1.0, 2.0], 'seconds')
    rows = [{'devices': n, 'kvstore': 'device', 'batch_mode': 'per-device',
             'per_device_batch': 32, 'batch_size': 32 * n, 'lr_rule': 'linear',
             'speedup': float(n)} for n in (1, 2)]
    lab_scaling_report.speedup_chart(str(tmp_path / f'speedup-{name}'), rows)
    for written in (name, f'bars-{name}', f'speedup-{name}'):
        assert (tmp_path / written).read_bytes().startswith(magic), written
    assert sorted(os.listdir(tmp_path)) == sorted([name, f'bars-{name}', f'speedup-{name}'])


@pytest.mark.parametrize('name, message', [
    ('acc.jpg', '--plot acc.jpg has the extension .jpg; a chart is written as .png, .svg, .pdf'),
    ('acc', '--plot acc has no extension; a chart is written as .png, .svg, .pdf'),
    ('acc.svgz', 'has the extension .svgz'),
])
def test_a_chart_name_without_a_chart_extension_is_refused(name, message, tmp_path):
    with pytest.raises(gm.GluonMultiGPUError) as refused:
        gm.charts.check_chart_path(name, '--plot')
    assert message in str(refused.value) and '\n' not in str(refused.value)
    with pytest.raises(gm.GluonMultiGPUError):
        gm.charts.accuracy_chart(str(tmp_path / name), [make_result('device', [1.0])])
    assert os.listdir(tmp_path) == []


# --- 4. no traceback for bad input; status 2 ------------------------------------------------

def test_balance_refuses_a_timing_interval_longer_than_its_runs(monkeypatch, capsys):
    balance = load_script('balance')
    monkeypatch.setattr(balance, 'measure_all', not_measured)
    assert balance.main(['--cpu-devices', '2', '--steps', '4']) == 2  # --every 5 by default
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and '--every 5 times one step in 5' in err
    assert 'give --every 4 or less' in err


def test_a_launcher_command_that_does_not_exist_is_one_line_and_status_2(tmp_path):
    proc = run_bounded([sys.executable, str(SCRIPTS / 'launch.py'), '-n', '1', '--',
                        str(tmp_path / 'no-such-program')], timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert 'is not a program that can be run here' in proc.stderr


def test_the_benchmarks_internal_worker_flag_misused_is_one_line(capsys):
    assert load_script('benchmark').main(['--worker', '{not json']) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and '--worker is how benchmark.py starts' in err


def test_a_failed_inflight_run_is_one_line(monkeypatch, capsys):
    inflight = load_script('inflight')

    def failing(*args, **kwargs):
        return subprocess.CompletedProcess(args, 2, '', 'Traceback (most recent call last):\n'
                                           'error: something the run said\npeak-rss-kib 10\n')
    monkeypatch.setattr(inflight.subprocess, 'run', failing)
    with pytest.raises(SystemExit) as stop:
        inflight.main(['--models', 'simple-cnn', '--values', '1', '--rounds', '1'])
    out, err = capsys.readouterr()
    said = err.strip()
    assert stop.value.code == 2 and out == ''
    assert said.startswith('error: the run with K=1 failed (status 2): ') and \
        said.endswith('something the run said') and '\n' not in said and 'Traceback' not in said


def test_json_of_inflight_is_written_whole(tmp_path, monkeypatch):
    inflight = load_script('inflight')
    monkeypatch.setattr(inflight, 'measure', lambda model, k, devices: (100.0 + k, 300.0))
    out = tmp_path / 'k.json'
    assert inflight.main(['--models', 'simple-cnn', '--values', '1', '0', '--rounds', '1',
                          '--json', str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r['k'] for r in rows] == [1, 0] and os.listdir(tmp_path) == ['k.json']

"""Figures for a dashboard: ``Metrics`` (``tensorboard``, ``metrics``, ``log_every``) and the
train command's --tensorboard, --metrics and --log-every.

The event files are read back with TensorBoard's own reader, as TensorBoard shows them: the
figures are the run's own (its ``TrainResult``), at the global steps expected; a run stopped,
or killed, and resumed from its checkpoint continues the same curves without a step twice, in
the event files and the JSON lines alike; bad input is one line before any work, leaving no
file; a parameter server's workers after the first write nothing.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import gluon_multigpu as gm
from gluon_multigpu.features.distributed import Worker
from conftest import REPO, limited, load_script, run_bounded, wait_bounded

STEPS = 8  # steps of an epoch of the data below (batch 32 on two devices)
EVERY = 2


def data():
    return gm.data.synthetic_data('fashion-mnist', 32, num_train=32 * STEPS, num_test=64,
                                  num_devices=2)


def scalars(folder):
    """Every scalar of the event files in ``folder``: tag -> [(step, value)], as TensorBoard
    reads them (the events a later file's purge step drops left out)."""
    reader = EventAccumulator(str(folder), size_guidance={'scalars': 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)]
            for tag in reader.Tags()['scalars']}


def records(path, kind=None):
    with open(path, encoding='utf-8') as f:
        lines = [json.loads(line) for line in f]
    return [r for r in lines if kind in (None, r['kind'])]


def training(tmp_path, *hooks, resume=None, **options):
    """A Training of the simple CNN on two CPU contexts writing ``tb`` and ``m.jsonl`` in
    ``tmp_path``; ``resume``: with a Checkpointer in ``tmp_path / 'ckpt'`` (resuming or not)."""
    train_iter, test_iter = data()
    if resume is not None:
        hooks = (gm.Checkpointer(tmp_path / 'ckpt', {'run': 'metrics'}, resume=resume), *hooks)
    options = {'tensorboard': tmp_path / 'tb', 'metrics': tmp_path / 'm.jsonl',
               'log_every': EVERY, **options}
    return gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), hooks=hooks,
                       **options)


class StopAt(gm.Hook):
    """Stop (as Ctrl-C does) after step ``step`` of epoch ``epoch``; or die there (``kill``:
    an exception, so that no checkpoint of the partial epoch is written, as after SIGKILL)."""

    def __init__(self, epoch, step, kill=False):
        self.epoch, self.step, self.kill = epoch, step, kill

    def step_end(self, run, step, samples, timer):
        if (run.epoch, step) == (self.epoch, self.step):
            if self.kill:
                raise Killed()
            return True
        return None


class Killed(Exception):
    pass


def assert_curves_of(result, tb, lines):
    """The event files and the JSON lines hold ``result``'s epochs at their last global steps,
    and a step record every ``EVERY`` steps, each step once."""
    epochs = len(result.epochs)
    ends = [STEPS * e for e in range(1, epochs + 1)]
    found = scalars(tb)
    assert [s for s, _ in found['step/loss']] == list(range(EVERY, STEPS * epochs + 1, EVERY))
    for tag, field in (('train_loss', 'train_loss'), ('train_accuracy', 'train_acc'),
                       ('test_accuracy', 'test_acc'), ('seconds', 'seconds')):
        assert [s for s, _ in found[f'epoch/{tag}']] == ends, tag
        assert [v for _, v in found[f'epoch/{tag}']] == pytest.approx(
            [getattr(r, field) for r in result.epochs], rel=1e-6), tag
    steps = records(lines, 'step')
    assert [r['step'] for r in steps] == [s for s, _ in found['step/loss']]
    assert [r['values']['loss'] for r in steps] == pytest.approx(
        [v for _, v in found['step/loss']], rel=1e-6)
    ended = records(lines, 'epoch')
    assert [(r['step'], r['epoch']) for r in ended] == list(zip(ends, range(1, epochs + 1)))
    assert [r['values']['train_loss'] for r in ended] == pytest.approx(
        [r.train_loss for r in result.epochs], rel=1e-12)
    return found


def test_the_event_files_and_the_json_lines_hold_the_runs_figures(tmp_path):
    result = gm.train(gm.simple_cnn(), *data(), gm.cpu_devices(2), num_epochs=2,
                      tensorboard=tmp_path / 'tb', metrics=tmp_path / 'm.jsonl', log_every=EVERY)
    found = assert_curves_of(result, tmp_path / 'tb', tmp_path / 'm.jsonl')
    assert set(found) == {f'step/{n}' for n in gm.metrics.STEP_FIGURES} | \
        {f'epoch/{n}' for n in gm.metrics.EPOCH_FIGURES}
    # each step record covers the steps since the last one: an epoch's records, of equal
    # samples, average to the epoch's own figures
    per = STEPS // EVERY
    for i, record in enumerate(result.epochs):
        for tag, field in (('step/loss', 'train_loss'), ('step/accuracy', 'train_acc')):
            window = [v for _, v in found[tag][i * per:(i + 1) * per]]
            assert sum(window) / per == pytest.approx(getattr(record, field), rel=1e-5)
        assert found['epoch/images_per_sec'][i][1] == pytest.approx(record.samples_per_sec,
                                                                    rel=1e-6)
    assert [v for _, v in found['step/learning_rate']] == pytest.approx([result.lr] * 2 * per)
    assert all(v > 0 for _, v in found['step/grad_norm'] + found['step/images_per_sec'])
    line = records(tmp_path / 'm.jsonl')[0]
    assert set(line) == {'kind', 'step', 'epoch', 'time', 'values'}
    assert set(line['values']) == set(gm.metrics.STEP_FIGURES)


def test_a_stopped_run_resumed_continues_the_same_curves(tmp_path):
    with pytest.raises(gm.Interrupted):
        training(tmp_path, StopAt(2, 5), resume=False).fit(3)  # a checkpoint of 5 steps
    assert [r['step'] for r in records(tmp_path / 'm.jsonl', 'step')][-1] == STEPS + 4
    result = training(tmp_path, resume=True).fit(3)  # from step 6 of epoch 2
    assert [r.epoch for r in result.epochs] == [1, 2, 3]
    assert_curves_of(result, tmp_path / 'tb', tmp_path / 'm.jsonl')
    assert len(os.listdir(tmp_path / 'tb')) == 2  # an event file for each run


def test_a_killed_run_resumed_drops_what_it_wrote_past_its_checkpoint(tmp_path):
    with pytest.raises(Killed):
        training(tmp_path, StopAt(2, 7, kill=True), resume=False).fit(3)
    before = records(tmp_path / 'm.jsonl')
    assert [r['step'] for r in before if r['step'] > STEPS] == [10, 12, 14]  # past epoch 1
    with open(tmp_path / 'm.jsonl', 'a', encoding='utf-8') as f:
        f.write('{"kind": "step", "st')  # a line the kill cut short
    assert [s for s, _ in scalars(tmp_path / 'tb')['step/loss']][-1] == 14
    result = training(tmp_path, resume=True).fit(3)  # from the checkpoint of epoch 1
    assert_curves_of(result, tmp_path / 'tb', tmp_path / 'm.jsonl')
    after = records(tmp_path / 'm.jsonl')
    assert after[:5] == before[:5]  # epoch 1's records, kept as they were
    assert after[5]['step'] == 10 and after[5]['time'] > before[-1]['time']  # the new run's


def test_a_fit_continued_after_a_stop_goes_on_with_its_files(tmp_path):
    run = training(tmp_path, StopAt(1, 3))
    with pytest.raises(gm.Interrupted):
        run.fit(2)
    result = run.fit()  # the notebook's way on: the rest of epoch 1, then epoch 2
    assert_curves_of(result, tmp_path / 'tb', tmp_path / 'm.jsonl')


def test_data_without_a_length_counts_the_steps_it_runs(tmp_path):
    train_iter, test_iter = data()
    gm.train(gm.simple_cnn(), iter(list(train_iter)), test_iter, gm.cpu_devices(2),
             num_epochs=1, metrics=tmp_path / 'm.jsonl', log_every=3)
    assert [(r['kind'], r['step']) for r in records(tmp_path / 'm.jsonl')] == \
        [('step', 3), ('step', 6), ('epoch', STEPS)]


def one_line_error(match, **kwargs):
    with pytest.raises(gm.GluonMultiGPUError, match=match) as error:
        gm.metrics.Metrics(**kwargs)
    assert '\n' not in str(error.value)


def test_bad_arguments_are_one_line_naming_the_argument(tmp_path, monkeypatch):
    (tmp_path / 'file').write_text('x')
    one_line_error(r'^`log_every` is 0: give the steps between', path=tmp_path / 'm', every=0)
    one_line_error(r'^`log_every` is True', path=tmp_path / 'm', every=True)
    one_line_error(r'^`log_every` is 2.5', path=tmp_path / 'm', every=2.5)
    one_line_error(r'^`metrics` .*/no/m.jsonl: directory .*/no does not exist; create it first$',
                   path=tmp_path / 'no' / 'm.jsonl')
    one_line_error(r'^`metrics` .* is a directory; give a file name$', path=tmp_path)
    one_line_error(r'^`metrics` is an empty path', path='')
    one_line_error(r'^`tensorboard` .*/file is a file; give a folder$', tensorboard=tmp_path /
                   'file')
    one_line_error(r'^`tensorboard` .*/no/tb: directory .* does not exist', tensorboard=tmp_path /
                   'no' / 'tb')
    one_line_error(r'^`tensorboard` is int: give a folder', tensorboard=3)
    one_line_error(r'^the rank is -1', path=tmp_path / 'm', rank=-1)
    monkeypatch.setitem(sys.modules, 'tensorboardX', None)  # not installed
    one_line_error(r'^`tensorboard` needs the tensorboardX package, which is not installed in '
                   rf'this environment: {re.escape(sys.executable)} -m pip install tensorboardX '
                   r'\(it leaves NumPy as it is\)$', tensorboard=tmp_path / 'tb')
    gm.metrics.Metrics(path=tmp_path / 'm.jsonl')  # without tensorboard: not needed
    with pytest.raises(gm.GluonMultiGPUError, match='`log_every`'):
        gm.train(gm.simple_cnn(), *data(), gm.cpu_devices(2), num_epochs=1,
                 metrics=tmp_path / 'm.jsonl', log_every=0)
    assert sorted(os.listdir(tmp_path)) == ['file']  # nothing written


def test_the_train_command_says_how_to_get_tensorboardx_before_mxnet_loads(tmp_path):
    # this interpreter's pip, not the package's extra (its pins would take NumPy back to 1)
    code = ("import sys; sys.modules['tensorboardX'] = None; from gluon_multigpu.cli import train; "
            "status = train.main(['--cpu-devices', '1', '--synthetic', '--tensorboard', 'tb']); "
            "print(status, 'mxnet' in sys.modules)")
    done = run_bounded([sys.executable, '-c', code], timeout=120, cwd=tmp_path)
    assert done.stdout.split() == ['2', 'False'], done.stderr
    assert done.stderr == (f'error: --tensorboard needs the tensorboardX package, which is not '
                           f'installed in this environment: {sys.executable} -m pip install '
                           'tensorboardX (it leaves NumPy as it is)\n')
    assert os.listdir(tmp_path) == []


def test_the_workers_after_the_first_write_nothing(tmp_path):
    hook = gm.metrics.Metrics(tensorboard=tmp_path / 'tb', path=tmp_path / 'm.jsonl', rank=1)
    training_ = gm.Training(gm.simple_cnn(), *data(), gm.cpu_devices(2), hooks=[hook])
    assert not training_.run.want_grad_norm  # nor does it cost the step anything
    training_.fit(1)
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope='module')
def train_script():
    return load_script('train')


def argv(fashion_dir, *extra, epochs=1):
    return ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', str(epochs),
            '--num-train', str(64 * STEPS), '--num-test', '128', '--batch-size', '64',
            '--data-dir', str(fashion_dir), '--progress-interval', '0', *map(str, extra)]


def test_the_train_command_writes_and_resumes_both(train_script, fashion_dir, tmp_path,
                                                   capsys):
    outputs = ['--tensorboard', tmp_path / 'tb', '--metrics', tmp_path / 'm.jsonl',
               '--log-every', EVERY, '--checkpoint-dir', tmp_path / 'ckpt']
    assert train_script.main(argv(fashion_dir, *outputs)) == 0
    assert train_script.main(argv(fashion_dir, *outputs, '--resume', '--json',
                                  tmp_path / 'run.json', epochs=2)) == 0
    capsys.readouterr()
    history = json.loads((tmp_path / 'run.json').read_text())['runs'][0]['epochs']
    result = SimpleNamespace(epochs=[SimpleNamespace(**e) for e in history])
    found = assert_curves_of(result, tmp_path / 'tb', tmp_path / 'm.jsonl')
    assert [v for _, v in found['step/learning_rate']] == pytest.approx([0.3] * STEPS)


@pytest.mark.parametrize('extra, said', [
    (['--metrics', 'no/m.jsonl'], r'--metrics no/m.jsonl: directory .*/no does not exist'),
    (['--metrics', '.'], r'--metrics \. is a directory; give a file name'),
    (['--tensorboard', 'file'], r'--tensorboard .*/file is a file; give a directory'),
    (['--tensorboard', 'no/tb'], r'--tensorboard .*/no/tb: directory .*/no does not exist'),
    (['--log-every', '0'], r'argument --log-every: 0 is not positive'),
    (['--metrics', 'm', '--kvstore', 'local', 'device'],
     r'--tensorboard and --metrics follow one run; give a single --kvstore'),
    (['--metrics', 'm', '--book-literal'], r"--book-literal runs the text's loop"),
    (['--tensorboard', 'tb', 'X'], r'--tensorboard needs the tensorboardX package.* pip install '
                                   r'tensorboardX'),
])
def test_bad_flags_are_one_line_before_any_work(train_script, fashion_dir, tmp_path,
                                                monkeypatch, capsys, extra, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'file').write_text('x')
    if extra[-1] == 'X':
        extra = extra[:-1]
        monkeypatch.setitem(sys.modules, 'tensorboardX', None)
    if '--log-every' in extra:  # argparse's own error
        with pytest.raises(SystemExit) as stop:
            train_script.main(argv(fashion_dir, *extra))
        status = stop.value.code
    else:
        status = train_script.main(argv(fashion_dir, *extra))
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and 'Traceback' not in err
    assert re.search(said, err), err
    assert sorted(os.listdir(tmp_path)) == ['file']  # no file, no folder begun


def test_the_train_commands_workers_after_the_first_write_nothing(train_script, fashion_dir,
                                                                   tmp_path, monkeypatch, capsys):
    from gluon_multigpu.runs import train_run
    monkeypatch.setattr(train_run, 'join_parameter_server', lambda *a, **k: Worker(None, 1, 1))
    assert train_script.main(argv(fashion_dir, '--tensorboard', tmp_path / 'tb', '--metrics',
                                  tmp_path / 'm.jsonl')) == 0
    assert 'rank 1: epoch 1/1: ' in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


def test_event_files_past_a_file_size_limit_are_one_line_naming_the_file(tmp_path):
    """A full disk or a file-size limit while the event file is written: one line naming the
    event file, status 1; no traceback from a writer's thread or an atexit handler."""
    tb = tmp_path / 'tb'
    proc = run_bounded(limited([sys.executable, str(REPO / 'scripts' / 'train.py'),
                                '--cpu-devices', '2', '--model', 'simple-cnn', '--num-train',
                                '512', '--num-test', '64', '--batch-size', '64', '--synthetic',
                                '--progress-interval', '0', '--num-epochs', '2', '--tensorboard',
                                str(tb), '--log-every', '1'], FSIZE=1024), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and 'Traceback' not in proc.stderr, proc.stderr
    [name] = os.listdir(tb)
    assert name.startswith('events.out.tfevents.')
    assert proc.stderr.startswith(f'error: could not write {tb / name}: File too large; '), \
        proc.stderr


def script_run(tmp_path, *extra):
    return [sys.executable, str(REPO / 'scripts' / 'train.py'), '--cpu-devices', '2', '--model',
            'simple-cnn', '--num-train', '128', '--num-test', '64', '--batch-size', '64',
            '--synthetic', '--progress-interval', '0', '--metrics', str(tmp_path / 'm.jsonl'),
            '--log-every', '1', *extra]


def test_a_second_run_on_the_same_metrics_file_is_refused_while_the_first_holds_it(tmp_path):
    """Two runs at once on one --metrics file: the second is refused in one line (status 2),
    and the file holds the first run's lines only. (Before: both ran, the second's lines
    replaced the first's.)"""
    first = subprocess.Popen(script_run(tmp_path, '--num-epochs', '10000'), cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a bound for a broken case only: MXNet loading
        while not (tmp_path / 'm.jsonl').exists() or not (tmp_path / 'm.jsonl').read_text():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.2)
        second = run_bounded(script_run(tmp_path, '--num-epochs', '1'), cwd=tmp_path)
        assert second.returncode == 2, second.stderr
        assert len(second.stderr.splitlines()) == 1 and 'Traceback' not in second.stderr
        assert second.stderr.startswith(
            f'error: another run (process {first.pid}) is writing the metrics file '
            f'{tmp_path / "m.jsonl"}; wait until it ends, or give --metrics another path'), \
            second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        status = wait_bounded(first)
    assert status == 128 + signal.SIGTERM, first.stderr.read()
    epochs = [r['epoch'] for r in records(tmp_path / 'm.jsonl', 'epoch')]
    assert epochs == list(range(1, len(epochs) + 1))  # the first run's, each once
    assert sorted(os.listdir(tmp_path)) == ['m.jsonl']  # its lock gone with it


def test_a_fifo_or_a_socket_given_as_the_tensorboard_folder_is_named_as_what_it_is(
        train_script, fashion_dir, tmp_path, monkeypatch, capsys):
    import socket
    monkeypatch.chdir(tmp_path)
    os.mkfifo('fifo')
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind('sock')
        for name, kind in (('fifo', 'a FIFO (a named pipe)'), ('sock', 'a socket')):
            one_line_error(rf'^`tensorboard` {name} is {re.escape(kind)}, not a folder; give a '
                           'folder$', tensorboard=name)
            assert train_script.main(argv(fashion_dir, '--tensorboard', name)) == 2
            err = capsys.readouterr().err
            assert err.splitlines() == [f'error: --tensorboard {tmp_path / name} is {kind}, not '
                                        'a directory; give a directory'], err
    assert train_script.main(argv(fashion_dir, '--metrics', 'fifo')) == 2  # a file, not a FIFO
    assert capsys.readouterr().err.startswith('error: --metrics fifo exists and is not a regular '
                                              'file (a FIFO (a named pipe)); give the name of a')
    (tmp_path / 'file').write_text('x')
    one_line_error(r'^`tensorboard` file is a file; give a folder$', tensorboard='file')
    assert sorted(os.listdir(tmp_path)) == ['fifo', 'file', 'sock']


def test_a_metrics_file_holding_lines_of_another_writer_is_refused_and_left_as_it_was(tmp_path):
    """A resumed run keeps the file's records before its purge step and drops the rest: a line
    that is no record of the package's (the user's) was dropped without a word. Such a file is
    refused before any step (a line a kill cut short, the last, is no such line)."""
    with pytest.raises(gm.Interrupted):
        training(tmp_path, StopAt(2, 5), resume=False).fit(3)
    lines = (tmp_path / 'm.jsonl').read_text().splitlines(keepends=True)
    for other in ('my own note\n', '{"kind": "step"}\n', '[1, 2]\n', '\n'):
        held = ''.join(lines[:3] + [other] + lines[3:]) + '{"kind": "step", "st'
        (tmp_path / 'm.jsonl').write_text(held)
        with pytest.raises(gm.GluonMultiGPUError) as refused:
            training(tmp_path, resume=True).fit(3)
        assert str(refused.value) == (
            f'the metrics file {tmp_path / "m.jsonl"} holds lines that gluon-multigpu did not '
            f'write (line 4: {other.strip()!r}); it is left as it is: move it away, or give '
            '`metrics` another path')
        assert (tmp_path / 'm.jsonl').read_text() == held
        assert len(os.listdir(tmp_path / 'tb')) == 1  # no step run: no new event file
        assert sorted(os.listdir(tmp_path)) == ['ckpt', 'm.jsonl', 'tb']  # the lock let go
    (tmp_path / 'm.jsonl').write_text(''.join(lines) + '{"kind": "step", "st')
    assert_curves_of(training(tmp_path, resume=True).fit(3), tmp_path / 'tb', tmp_path / 'm.jsonl')


def test_the_train_command_refuses_to_resume_onto_a_metrics_file_with_other_lines(
        train_script, fashion_dir, tmp_path, capsys):
    outputs = ['--metrics', tmp_path / 'm.jsonl', '--checkpoint-dir', tmp_path / 'ckpt']
    assert train_script.main(argv(fashion_dir, *outputs)) == 0
    with open(tmp_path / 'm.jsonl', 'a', encoding='utf-8') as f:
        f.write('the user\'s line\n')
    held = (tmp_path / 'm.jsonl').read_text()
    capsys.readouterr()
    assert train_script.main(argv(fashion_dir, *outputs, '--resume', epochs=2)) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f'error: the metrics file {tmp_path / "m.jsonl"} holds lines that '
                                f'gluon-multigpu did not write (line {held.count(chr(10))}: '
                                '"the user\'s line"); it is left as it is: move it away, or give '
                                '--metrics another path'], err
    assert (tmp_path / 'm.jsonl').read_text() == held

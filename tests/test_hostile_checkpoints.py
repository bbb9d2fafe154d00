"""What a hostile user does to a checkpoint folder and the outputs: nothing of theirs is lost."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import REPO, load_script, run_bounded, wait_bounded

SCRIPT = str(REPO / 'scripts' / 'train.py')


def argv(fashion_dir, ckpt, *extra, epochs=2):
    return ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', str(epochs),
            '--num-train', '640', '--num-test', '100', '--batch-size', '64', '--lr', '0.2',
            '--data-dir', str(fashion_dir), '--checkpoint-dir', str(ckpt),
            '--progress-interval', '0', *map(str, extra)]


@pytest.fixture(scope='module')
def train():
    return load_script('train')


def one_line(captured):
    assert captured.out == '' and len(captured.err.splitlines()) == 1, captured
    assert 'Traceback' not in captured.err
    return captured.err


def test_a_save_keeps_the_users_own_files_and_survives_a_killed_saves_leftovers(
        train, fashion_dir, tmp_path, capsys):
    ckpt = tmp_path / 'ckpt'
    ckpt.mkdir()
    mine = {'ckpt-notes.txt': 'my notes', '.manifest.json.mine': 'x', 'ckpt-1.params': 'y'}
    for name, text in mine.items():
        (ckpt / name).write_text(text)
    # what a save killed mid-way leaves: a temporary file under the next save's name
    (ckpt / 'ckpt-000001.params.tmp').write_bytes(b'half a file')
    assert train.main(argv(fashion_dir, ckpt, epochs=1)) == 0
    assert train.main(argv(fashion_dir, ckpt, '--resume', epochs=2)) == 0
    capsys.readouterr()
    for name, text in mine.items():
        assert (ckpt / name).read_text() == text
    assert sorted(os.listdir(ckpt)) == sorted(['ckpt-000002.params', 'ckpt-000002.states',
                                               'manifest.json', *mine])


@pytest.mark.parametrize('flags, message', [
    (['--json', 'X', '--plot', 'X'], '--plot and --json name the same place'),
    (['--report', 'ckpt/r'], '--report and --checkpoint-dir name the same place'),
    (['--json', 'ckpt/r.json'], '--json and --checkpoint-dir name the same place'),
])
def test_outputs_that_collide_are_refused_before_training(train, fashion_dir, tmp_path, capsys,
                                                           flags, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert train.main(argv(fashion_dir, 'ckpt', *flags)) == 2
    assert message in one_line(capsys.readouterr())
    assert os.listdir(tmp_path) == []


def test_resuming_a_finished_run_writes_its_outputs(train, fashion_dir, tmp_path, capsys):
    ckpt = tmp_path / 'ckpt'
    assert train.main(argv(fashion_dir, ckpt, epochs=1)) == 0
    capsys.readouterr()
    report, out = tmp_path / 'report', tmp_path / 'r.json'
    assert train.main(argv(fashion_dir, ckpt, '--resume', '--json', out, '--report', report,
                           epochs=1)) == 0
    printed = capsys.readouterr().out
    assert 'resuming from the checkpoint epoch 1' in printed and 'test acc: ' in printed
    assert sorted(os.listdir(report)) == ['accuracy.png', 'report.md', 'runs.json', 'seconds.png']
    runs = json.loads(out.read_text())['runs']
    assert len(runs) == 1 and len(runs[0]['epochs']) == 1 and runs[0]['param_diff'] == []


@pytest.mark.slow
def test_two_runs_on_one_checkpoint_folder_the_second_is_refused(fashion_dir, tmp_path):
    ckpt = tmp_path / 'ckpt'
    first = subprocess.Popen([sys.executable, SCRIPT, *argv(fashion_dir, ckpt, epochs=1000)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().startswith('training simple-cnn')  # it holds the lock
        second = run_bounded([sys.executable, SCRIPT,
                              *argv(fashion_dir, ckpt, '--resume', epochs=1000)])
        assert second.returncode == 2 and second.stdout == ''
        assert 'another run is using the checkpoint directory' in second.stderr
        assert len(second.stderr.splitlines()) == 1
    finally:
        first.kill()
        wait_bounded(first)
    # the killed run's lock is not stuck: the next run takes it over
    third = run_bounded([sys.executable, SCRIPT, *argv(fashion_dir, ckpt, '--resume', epochs=1)])
    assert third.returncode in (0, 2), third.stderr
    assert 'another run is using' not in third.stderr


@pytest.mark.parametrize('edit, field', [
    (lambda m: m.update(epoch='two'), 'sequence and epoch'),
    (lambda m: m.pop('history'), 'field history is missing'),
    (lambda m: m['history'][0].update(test_acc='high'), 'history[0]: field test_acc'),
    (lambda m: m['files']['params'].update(name='../../etc/passwd'), 'files.params.name'),
    (lambda m: m.update(partial={'loss_sum': 1.0, 'num_correct': 1.0, 'samples': 64,
                                 'seconds': 1.0, 'batches': 99, 'stopped': True}),
     'partial.batches (99) is past the end of an epoch of 10 batches'),
])
def test_a_hand_edited_manifest_is_refused_naming_the_field(train, fashion_dir, tmp_path, capsys,
                                                            edit, field):
    ckpt = tmp_path / 'ckpt'
    assert train.main(argv(fashion_dir, ckpt, epochs=1)) == 0
    capsys.readouterr()
    manifest = json.loads((ckpt / 'manifest.json').read_text())
    edit(manifest)
    (ckpt / 'manifest.json').write_text(json.dumps(manifest))
    before = sorted(os.listdir(ckpt))
    assert train.main(argv(fashion_dir, ckpt, '--resume', epochs=2)) == 2
    err = one_line(capsys.readouterr())
    assert 'is damaged' in err and field in err, err
    assert sorted(os.listdir(ckpt)) == before


def test_a_dangling_symlink_as_checkpoint_dir_is_one_line(train, fashion_dir, tmp_path, capsys):
    (tmp_path / 'link').symlink_to(tmp_path / 'gone')
    assert train.main(argv(fashion_dir, tmp_path / 'link')) == 2
    assert 'is a symbolic link to nothing' in one_line(capsys.readouterr())


@pytest.mark.slow
def test_nothing_is_left_in_the_temporary_folder(fashion_dir, tmp_path):
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    args = argv(fashion_dir, tmp_path / 'ckpt')
    del args[args.index('--checkpoint-dir'):args.index('--checkpoint-dir') + 2]
    proc = run_bounded([sys.executable, SCRIPT, *map(str, args),
                        '--kvstore', 'local', 'device', '--report', tmp_path / 'rep'], env=env)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp) == [] and tempfile.gettempdir() != str(tmp)


@pytest.mark.slow
@pytest.mark.parametrize('tmpdir', ['/nonexistent/tmp', '/proc'])
def test_a_temporary_folder_that_takes_no_files_does_not_stop_a_run(fashion_dir, tmp_path, tmpdir):
    args = argv(fashion_dir, tmp_path / 'ckpt', epochs=1)
    del args[args.index('--checkpoint-dir'):args.index('--checkpoint-dir') + 2]
    proc = run_bounded([sys.executable, SCRIPT, *map(str, args)],
                       env=dict(os.environ, TMPDIR=tmpdir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].startswith('test acc: ')

"""What a hostile user does to a checkpoint folder and the outputs: nothing of theirs is lost."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as onp
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
    mine = {'ckpt-notes.txt': 'my notes', '.manifest.json.mine': 'x', 'ckpt-1.params': 'y',
            'ckpt-000001.params.tmp': 'a name earlier versions used'}
    for name, text in mine.items():
        (ckpt / name).write_text(text)
    assert train.main(argv(fashion_dir, ckpt, epochs=1)) == 0
    # what a save killed after placing its files leaves: its private folder (marked as the
    # package's), the record of what it placed, and the placed files under the next names
    save = ckpt / '.ckpt-save.killed'
    save.mkdir()
    (save / 'save-marker').write_text('gluon-multigpu-checkpoint-save, pid 12345\n')
    placed = {}
    for role in ('params', 'states'):
        data = f'a placed {role} file'.encode()
        (ckpt / f'ckpt-000002.{role}').write_bytes(data)
        placed[role] = {'name': f'ckpt-000002.{role}', 'bytes': len(data),
                        'sha256': hashlib.sha256(data).hexdigest()}
    (save / 'placed.json').write_text(json.dumps({'placed': placed, 'replaced': {}}))
    (save / 'params').write_bytes(b'half a file')
    assert train.main(argv(fashion_dir, ckpt, '--resume', epochs=2)) == 0
    capsys.readouterr()
    for name, text in mine.items():
        assert (ckpt / name).read_text() == text
    assert sorted(os.listdir(ckpt)) == sorted(['ckpt-000002.params', 'ckpt-000002.states',
                                               'manifest.json', *mine])
    assert (ckpt / 'ckpt-000002.params').stat().st_size > 1000  # the run's, not the leftover


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


def test_resuming_a_finished_run_writes_its_outputs(train, fashion_dir, tmp_path, capsys,
                                                   one_epoch):
    ckpt = tmp_path / 'ckpt'
    shutil.copytree(one_epoch, ckpt)
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
    (lambda m: m.update(epoch='two'), 'sequence (1 to 999999) and epoch (0 or more)'),
    (lambda m: m.pop('history'), 'field history is missing'),
    (lambda m: m['history'][0].update(test_acc='high'), 'history[0]: field test_acc'),
    (lambda m: m['files']['params'].update(name='../../etc/passwd'), 'files.params.name'),
    (lambda m: m.update(partial={'loss_sum': 1.0, 'num_correct': 1.0, 'samples': 6400,
                                 'seconds': 1.0, 'batches': 99, 'stopped': True}),
     'partial.batches (99) is past the end of an epoch of 10 batches'),
])
def test_a_hand_edited_manifest_is_refused_naming_the_field(train, fashion_dir, tmp_path, capsys,
                                                            one_epoch, edit, field):
    ckpt = tmp_path / 'ckpt'
    shutil.copytree(one_epoch, ckpt)
    capsys.readouterr()
    manifest = json.loads((ckpt / 'manifest.json').read_text())
    edit(manifest)
    (ckpt / 'manifest.json').write_text(json.dumps(manifest))
    before = sorted(os.listdir(ckpt))
    assert train.main(argv(fashion_dir, ckpt, '--resume', epochs=2)) == 2
    err = one_line(capsys.readouterr())
    assert 'is damaged' in err and field in err, err
    assert sorted(os.listdir(ckpt)) == before


def damage_params(ckpt, manifest):
    """Garble the params file and record its new hash, as someone who can write the folder can."""
    params = ckpt / manifest['files']['params']['name']
    data = bytearray(params.read_bytes())
    data[40:4000] = b'\xff' * 3960
    params.write_bytes(bytes(data))
    manifest['files']['params'].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    return json.dumps(manifest)


def history_field(name, value):
    def edit(ckpt, manifest):  # pylint: disable=unused-argument
        manifest['history'][0][name] = value
        return json.dumps(manifest)
    return edit


# (edit of the manifest: returns its new text, a phrase of the one line)
RAW_EDITS = [
    (history_field('seconds', 0), 'history[0]: field seconds is 0, and it must be above 0'),
    (history_field('train_acc', float('nan')), 'NaN is not a number a manifest holds'),
    (history_field('test_acc', -3.5), 'field test_acc is -3.5, and it must be from 0 to 1'),
    (lambda c, m: json.dumps(dict(m, partial={'loss_sum': 1.0, 'num_correct': 1.0, 'samples': -7000,
                                           'seconds': 1.0, 'batches': 2, 'stopped': True})),
     'field samples is -7000, and it must be at least 1'),
    (lambda c, m: json.dumps(dict(m, sequence=999999 + 1)), 'sequence (1 to 999999)'),
    (lambda c, m: json.dumps(dict(m, sequence=2)), "files.params.name 'ckpt-000001.params' is not"),
    (lambda c, m: '[' * 200000 + ']' * 200000, 'nested deeper than any manifest'),
    (lambda c, m: json.dumps(dict(m, padding='x' * (33 << 20))), 'larger than 32 MiB'),
    (damage_params, 'ckpt-000001.params is not an array file MXNet can read'),
]


@pytest.fixture(scope='module')
def one_epoch(train, fashion_dir, tmp_path_factory):
    """A checkpoint folder after one epoch, trained once for the module: copy it."""
    ckpt = tmp_path_factory.mktemp('one-epoch') / 'ckpt'
    assert train.main(argv(fashion_dir, ckpt, epochs=1)) == 0
    return ckpt


@pytest.mark.parametrize('edit, phrase', RAW_EDITS, ids=[
    'zero seconds', 'NaN', 'negative share', 'negative samples', 'sequence past the names',
    'names of another sequence', 'deep nesting', 'huge', 'params garbled, hash updated'])
def test_a_manifest_out_of_range_is_one_line_before_any_work(train, fashion_dir, tmp_path,
                                                            capsys, one_epoch, edit, phrase):
    ckpt = tmp_path / 'ckpt'
    shutil.copytree(one_epoch, ckpt)
    capsys.readouterr()
    (ckpt / 'manifest.json').write_text(
        edit(ckpt, json.loads((ckpt / 'manifest.json').read_text())))
    before = {n: (ckpt / n).read_bytes() for n in os.listdir(ckpt)}
    assert train.main(argv(fashion_dir, ckpt, '--resume', epochs=2)) == 2
    err = one_line(capsys.readouterr())
    assert 'is damaged' in err and phrase in err, err
    assert {n: (ckpt / n).read_bytes() for n in os.listdir(ckpt)} == before


@pytest.mark.parametrize('name', ['manifest.json', '.lock'])
def test_a_directory_in_place_of_the_manifest_or_lock_is_refused_at_once(
        train, fashion_dir, tmp_path, capsys, name):
    ckpt = tmp_path / 'ckpt'
    (ckpt / name).mkdir(parents=True)
    assert train.main(argv(fashion_dir, ckpt, '--resume')) == 2
    err = one_line(capsys.readouterr())  # nothing printed on stdout: no epoch was trained
    assert 'is not a regular file' in err, err
    assert os.listdir(ckpt) == [name]


def test_a_fresh_run_refuses_a_folder_holding_checkpoint_files_it_did_not_write(
        train, fashion_dir, tmp_path, capsys):
    ckpt = tmp_path / 'ckpt'
    ckpt.mkdir()
    (ckpt / 'ckpt-000003.params').write_text('my own weights')
    for extra in ([], ['--resume']):
        assert train.main(argv(fashion_dir, ckpt, *extra)) == 2
        err = one_line(capsys.readouterr())
        assert 'holds ckpt-000003.params, which no checkpoint' in err and 'move it away' in err
    assert os.listdir(ckpt) == ['ckpt-000003.params']
    assert (ckpt / 'ckpt-000003.params').read_text() == 'my own weights'


def test_an_output_link_is_written_through_and_stays_a_link(train, fashion_dir, tmp_path,
                                                            capsys):
    real, link = tmp_path / 'real.json', tmp_path / 'link.json'
    real.write_text('{}')
    link.symlink_to('real.json')
    args = argv(fashion_dir, tmp_path / 'ckpt', '--json', link, epochs=1)
    assert train.main(args[:args.index('--checkpoint-dir')] + args[
        args.index('--checkpoint-dir') + 2:]) == 0
    capsys.readouterr()
    assert link.is_symlink() and os.readlink(link) == 'real.json'
    assert json.loads(real.read_text())['runs'][0]['epochs'][0]['epoch'] == 1


@pytest.mark.slow
def test_an_output_linked_to_standard_output_is_refused(fashion_dir, tmp_path):
    """``/dev/stdout`` is a link to ``/proc/self/fd/1``: replacing what it leads to loses the log."""
    (tmp_path / 'stdout').symlink_to('/proc/self/fd/1')
    log = tmp_path / 'log.txt'
    with open(log, 'w') as out:  # standard output redirected to a file, as a shell does
        proc = subprocess.run([sys.executable, SCRIPT,
                               *map(str, argv(fashion_dir, tmp_path / 'c', epochs=1)),
                               '--json', str(tmp_path / 'stdout')],
                              stdout=out, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
    assert 'leads to /proc/' in proc.stderr and 'give the name of a regular file' in proc.stderr
    assert (tmp_path / 'stdout').is_symlink() and log.read_text() == ''


@pytest.mark.parametrize('where', ['data file', 'checkpoint manifest', 'checkpoint folder'])
def test_an_output_may_not_name_an_input_or_a_checkpoint(train, fashion_dir, tmp_path, capsys,
                                                         where):
    data = tmp_path / 'data'
    shutil.copytree(fashion_dir, data)
    other = tmp_path / 'other'
    assert train.main(argv(data, other, epochs=1)) == 0
    capsys.readouterr()
    target = {'data file': data / 't10k-labels-idx1-ubyte.gz',
              'checkpoint manifest': other / 'manifest.json',
              'checkpoint folder': other / 'accuracy.json'}[where]
    before = {p: p.read_bytes() for d in (data, other) for p in d.iterdir()}
    flag = '--plot' if where == 'checkpoint folder' else '--json'
    args = argv(data, tmp_path / 'mine', epochs=1)
    assert train.main(args + [flag, str(target).replace('.json', '.png')
                              if flag == '--plot' else str(target)]) == 2
    err = one_line(capsys.readouterr())
    assert ("one of the run's input files" if where == 'data file' else
            'is in the checkpoint folder') in err, err
    assert {p: p.read_bytes() for d in (data, other) for p in d.iterdir()} == before
    assert not (tmp_path / 'mine').exists()


def test_an_output_under_a_regular_file_says_so(train, fashion_dir, tmp_path, capsys):
    (tmp_path / 'afile').write_text('x')
    for flag in ('--json', '--report'):
        assert train.main(argv(fashion_dir, tmp_path / 'c', flag, tmp_path / 'afile' / 'x')) == 2
        assert f'{tmp_path / "afile"} is a file, not a directory' in one_line(capsys.readouterr())


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


# --- the library, without the script's checks --------------------------------------------------

def tiny_net():
    """A one-layer network and its Trainer after one step, and a checkpoint history."""
    import mxnet as mx
    from mxnet import gluon, np
    import gluon_multigpu as gm
    mx.npx.set_np()
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(3, in_units=4))
    net.initialize(ctx=mx.cpu())
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
    gm.train_batch(net, np.ones((2, 4)), np.zeros(2, dtype='int32'),
                   gluon.loss.SoftmaxCrossEntropyLoss(), trainer, [mx.cpu()])
    return net, trainer, [gm.EpochRecord(e, 1.0, 0.5, 0.5, 1.0, 0.1, 8) for e in (1, 2)]


def files_in(directory):
    return {os.path.relpath(os.path.join(root, n), directory):
            open(os.path.join(root, n), 'rb').read()
            for root, _, names in os.walk(directory) for n in names}


def test_a_users_folder_named_like_a_save_folder_is_kept(tmp_path):
    """Only a folder marked as a save's (or empty) is removed, whatever its name."""
    import gluon_multigpu as gm
    net, trainer, history = tiny_net()
    ckpt = tmp_path / 'ckpt'
    gm.Checkpointer(ckpt, {'k': 1}).save(net, trainer, history[:1], 1)
    mine = {'.ckpt-save.abc123/notes.txt': b'my notes',
            '.ckpt-save.other/save-marker': b'my own file of that name',
            '.ckpt-save.extra/save-marker': b'gluon-multigpu-checkpoint-save, pid 7\n',
            '.ckpt-save.extra/params.bak': b'my copy'}
    for name, data in mine.items():
        (ckpt / name).parent.mkdir(exist_ok=True)
        (ckpt / name).write_bytes(data)
    (ckpt / '.ckpt-save.empty').mkdir()  # nothing to lose: removed
    (ckpt / '.ckpt-save.cut').mkdir()  # a save killed while writing its marker: removed
    (ckpt / '.ckpt-save.cut' / 'save-marker').write_bytes(b'gluon-multigpu-checkpoint-sa')
    gm.Checkpointer(ckpt, {'k': 1}, resume=True).save(net, trainer, history, 2)
    after = files_in(ckpt)
    assert {n: after.get(n) for n in mine} == mine
    assert sorted(os.listdir(ckpt)) == sorted(['.ckpt-save.abc123', '.ckpt-save.other',
                                               '.ckpt-save.extra', 'ckpt-000002.params',
                                               'ckpt-000002.states', 'manifest.json'])


@pytest.mark.parametrize('resume, config, phrase', [
    (False, {'k': 1}, 'already holds a checkpoint (epoch 1, in '),
    (False, {'k': 2}, 'already holds a checkpoint (epoch 1, in '),
    (True, {'k': 2}, 'is of another run: k 1 (now 2)'),
])
def test_a_checkpointer_refuses_another_runs_checkpoint_without_check_directory(
        tmp_path, resume, config, phrase):
    import gluon_multigpu as gm
    net, trainer, history = tiny_net()
    ckpt = tmp_path / 'ckpt'
    gm.Checkpointer(ckpt, {'k': 1}).save(net, trainer, history[:1], 1)
    before = files_in(ckpt)
    with pytest.raises(gm.CheckpointError) as refused:  # a save: refused before it writes
        gm.Checkpointer(ckpt, config, resume=resume).save(net, trainer, history, 2)
    message = str(refused.value)
    assert phrase in message and str(ckpt) in message and len(message.splitlines()) == 1
    assert ('add `resume=True` to continue it, choose another `checkpoint_dir`, or remove it'
            if not resume else 'choose another `checkpoint_dir`, or remove it') in message
    images = onp.random.default_rng(0).integers(0, 255, (32, 28, 28)).astype('uint8')
    labels = onp.random.default_rng(1).integers(0, 10, 32).astype('int32')
    data = gm.data.ArrayLoader(images, labels, 16)
    with pytest.raises(gm.CheckpointError, match=re.escape(phrase)):  # train: refused at begin
        gm.train(gm.simple_cnn(), data, None, [__import__('mxnet').cpu()], num_epochs=1,
                 hooks=[gm.Checkpointer(ckpt, config, resume=resume)])
    assert files_in(ckpt) == before

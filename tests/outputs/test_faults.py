"""Fault injection: random SIGKILLs of a checkpointed run, and every hostile input of the CLI.

A killed run resumed with --resume must end with the same history and
parameters as a run never killed (or stop with one clear line); a hostile
input must end with its exit status, one line on stderr, no traceback,
nothing of the user's deleted, and nothing left in the temporary folder.
"""
import gzip
import hashlib
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

import gluon_multigpu as gm
from conftest import REPO, Lines, limited, run_bounded, wait_bounded
from checkpoint_files import assert_same_run, manifest

pytestmark = pytest.mark.slow  # subprocesses or real training: the full suite's

SCRIPT = str(REPO / 'scripts' / 'train.py')


def argv(fashion_dir, ckpt, *extra):
    # about 8 s of work: 20 epochs of 16 steps, each saved (more than the kills' tries can
    # reach: each try trains its first epoch and about one more, and the suite's load can make
    # a try's epochs several times shorter than the one measured: 5 tries stay short of 20
    # epochs, so every try is killed). The kills are drawn in units of an epoch, so its size
    # is free: 16 steps (4 updates of 4 batches with
    # UPDATES, the 5 warm-up updates reaching into epoch 2) and 3 test batches; 60 steps and
    # 10 batches made the test 1.5 to 1.7 times as long for the same kills (the start of each
    # of its 7 processes, MXNet loading, is the same at any size)
    return ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '20', '--num-train',
            '512', '--num-test', '96', '--batch-size', '32', '--lr', '0.1', '--data-dir',
            str(fashion_dir), '--checkpoint-dir', str(ckpt), '--progress-interval', '0',
            *map(str, extra)]


#: Updates other than the book's: 4 batches an update, the rate of each from a schedule that
#: spans the 20 epochs, the gradient clipped (a resumed run must take each where it stood).
#: The random kills are made with these only: resumed, such a run restores what a run of the
#: book's updates restores (parameters, optimizer state, the data's order) and besides it the
#: update count the schedule's rates go on from, so the book's updates would take the same
#: loop through less of the checkpoint (they were a second case of this test, as long as this
#: one). A run of the book's updates killed in the middle of an epoch and resumed to the
#: uninterrupted result: tests/training/test_checkpoint.py's
#: test_sigkill_in_the_middle_of_an_epoch_then_resume_matches.
UPDATES = ('--accumulate', '4', '--lr-schedule', 'onecycle', '--warmup-steps', '5',
           '--clip-grad-norm', '0.5')


@pytest.mark.slow
def test_random_sigkills_then_resume_reach_the_uninterrupted_result(fashion_dir, tmp_path):
    updates = UPDATES
    whole = tmp_path / 'whole'
    assert run_bounded([sys.executable, SCRIPT,
                        *argv(fashion_dir, whole, *updates)]).returncode == 0
    # Kill times are drawn in units of this machine's epoch (measured by the run above, so a
    # fast or a loaded machine gets as many kills): some tries are killed while the script
    # starts (MXNet loading, data, first save); the others once the try has finished an epoch
    # of its own (its checkpoint saved), within the next epoch (training, evaluating, saving),
    # so that the later tries resume from a checkpoint a kill left, not from nothing.
    epoch = max(e['seconds'] + e['eval_seconds'] for e in manifest(whole)['history'])
    ckpt = tmp_path / 'ckpt'
    rng = random.Random(1234)  # the same choices on every run of the test
    kills, resumed = 0, []
    for attempt in range(5):
        extra = [*updates, '--resume'] if attempt else list(updates)
        done = manifest(ckpt)['epoch'] if (ckpt / 'manifest.json').exists() else 0
        resumed.append(done)
        proc = subprocess.Popen([sys.executable, SCRIPT, *argv(fashion_dir, ckpt, *extra)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = Lines(proc.stdout)
        if rng.random() < 0.3:
            # The sleeps are the feature: a kill at a random time (drawn, not an order)
            time.sleep(rng.uniform(0.1, 2.0))  # starting: anywhere before training
        else:
            lines.wait_for(rf'^epoch {done + 1}/20: ', timeout=300)  # its first epoch: saved
            time.sleep(rng.uniform(0.0, 1.0) * epoch)  # training, evaluating, saving
        proc.send_signal(signal.SIGKILL)
        status = wait_bounded(proc)
        err = proc.stderr.read()
        assert 'Traceback' not in err, err
        if status == 0:
            break  # it finished before the kill
        kills += 1
        assert status == -signal.SIGKILL, (status, err)
        if (ckpt / 'manifest.json').exists():
            assert manifest(ckpt)['format'] == gm.checkpoint.FORMAT
    # (the tries resumed from checkpoints that kills left, mid-way through the schedule)
    assert len([d for d in resumed if 0 < d < 20]) >= 2, resumed
    final = run_bounded([sys.executable, SCRIPT, *argv(fashion_dir, ckpt, *updates, '--resume')])
    assert final.returncode == 0, final.stderr
    assert kills >= 3, kills  # the test killed runs, not only watched them finish
    assert_same_run(ckpt, whole)
    assert sorted(os.listdir(ckpt)) == ['ckpt-%06d.params' % manifest(ckpt)['sequence'],
                                        'ckpt-%06d.states' % manifest(ckpt)['sequence'],
                                        'manifest.json']


def short_argv(fashion_dir, ckpt, epochs, *extra):
    return [*argv(fashion_dir, ckpt, *extra)[:4], '--num-epochs', str(epochs),
            *argv(fashion_dir, ckpt, *extra)[6:]]


@pytest.mark.slow
def test_links_planted_in_a_checkpoint_folder_touch_nothing_outside_it(fashion_dir, tmp_path):
    """Links under the names a save uses (before this version: ``.tmp`` names) lead nowhere."""
    ckpt, victim = tmp_path / 'ckpt', tmp_path / 'victim.txt'
    victim.write_text('outside the folder')
    first = run_bounded([sys.executable, SCRIPT, *short_argv(fashion_dir, ckpt, 1)])
    assert first.returncode == 0, first.stderr
    # the next save's names, and the temporary names earlier versions wrote through
    for name in ('ckpt-000002.params.tmp', 'ckpt-000002.states.tmp', 'ckpt-000002.params'):
        (ckpt / name).symlink_to(victim)
    refused = run_bounded([sys.executable, SCRIPT, *short_argv(fashion_dir, ckpt, 2, '--resume')])
    assert refused.returncode == 2 and refused.stderr.count('\n') == 1, refused.stderr
    assert 'holds ckpt-000002.params, which no checkpoint' in refused.stderr
    assert victim.read_text() == 'outside the folder'
    os.remove(ckpt / 'ckpt-000002.params')  # the user moves it away, as the line says
    (ckpt / 'manifest.json.planted').symlink_to(victim)
    done = run_bounded([sys.executable, SCRIPT, *short_argv(fashion_dir, ckpt, 2, '--resume')])
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == 'outside the folder'
    for name in ('ckpt-000002.params', 'ckpt-000002.states', 'manifest.json'):
        assert not (ckpt / name).is_symlink() and (ckpt / name).is_file()
    assert manifest(ckpt)['epoch'] == 2
    # a manifest or a lock file that is a link is refused, not followed
    for name in ('manifest.json', '.lock'):
        saved = (ckpt / name).read_bytes() if name == 'manifest.json' else None
        if saved is not None:
            os.replace(ckpt / name, tmp_path / 'manifest.json')
        (ckpt / name).symlink_to(tmp_path / 'manifest.json' if saved else victim)
        answer = run_bounded([sys.executable, SCRIPT,
                              *short_argv(fashion_dir, ckpt, 3, '--resume')])
        assert answer.returncode == 2 and answer.stderr.count('\n') == 1, answer.stderr
        assert ('is a symbolic link' if saved else 'is not a regular file') in answer.stderr
        os.remove(ckpt / name)
        if saved is not None:
            os.replace(tmp_path / 'manifest.json', ckpt / name)
    assert victim.read_text() == 'outside the folder'


class Planted:
    """A pickle that, when loaded, creates the file ``path``: what a planted .states would do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.mark.slow
def test_a_planted_pickle_as_optimizer_state_runs_nothing(fashion_dir, tmp_path):
    ckpt, marker = tmp_path / 'ckpt', tmp_path / 'code-ran'
    first = run_bounded([sys.executable, SCRIPT, *short_argv(fashion_dir, ckpt, 1)])
    assert first.returncode == 0, first.stderr
    m = manifest(ckpt)
    states = ckpt / m['files']['states']['name']
    data = pickle.dumps({0: Planted(str(marker))})
    pickle.loads(data)  # the pickle does run code when unpickled ...
    assert marker.exists()
    marker.unlink()
    states.write_bytes(data)  # ... and whoever can write the folder can update the hash
    m['files']['states'].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (ckpt / 'manifest.json').write_text(json.dumps(m))
    proc = run_bounded([sys.executable, SCRIPT, *short_argv(fashion_dir, ckpt, 2, '--resume')])
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert f'is damaged: {states.name} is not an array file' in proc.stderr, proc.stderr
    assert not marker.exists()
    # the same for a checkpoint of the earlier format, whose states file was a pickle
    m['format'] = 'gluon-multigpu-checkpoint-1'
    (ckpt / 'manifest.json').write_text(json.dumps(m))
    proc = run_bounded([sys.executable, SCRIPT, *short_argv(fashion_dir, ckpt, 2, '--resume')])
    assert proc.returncode == 2 and 'which could run code when loaded' in proc.stderr
    assert not marker.exists()


def bad_header_dir(base, fashion_dir):
    d = base / 'header'
    shutil.copytree(fashion_dir, d)
    with gzip.open(d / 't10k-images-idx3-ubyte.gz', 'wb') as f:  # dimensions past 2**64
        f.write(b'\x00\x00\x08\x03' + b'\xff\xff\xff\xff' * 3)
    return d


QUICK = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1', '--num-train', '256',
         '--num-test', '64', '--batch-size', '64', '--progress-interval', '0']

# (name, arguments, environment changes, exit status, a phrase of the one line)
CASES = [
    ('too many contexts', ['--cpu-devices', '1000000000'], {}, 2, 'is above 64'),
    ('seed past 32 bits', ['--seed', str(2**32)], {}, 2, 'is above 4294967295'),
    ('threads not a number', QUICK, {'OMP_NUM_THREADS': 'abc'}, 2, 'OMP_NUM_THREADS'),
    ('no scratch copies', QUICK, {'MXNET_CPU_TEMP_COPY': '0'}, 2, 'MXNET_CPU_TEMP_COPY'),
    ('same output twice', QUICK + ['--json', 'x', '--plot', 'x'], {}, 2, 'name the same place'),
    ('report in the checkpoint', QUICK + ['--checkpoint-dir', 'c', '--report', 'c/r'], {}, 2,
     'name the same place'),
    ('a device as output', QUICK + ['--json', '/dev/null'], {}, 2, 'is not a regular file'),
    ('a name too long', QUICK + ['--json', 'x' * 250], {}, 2, 'give a shorter name'),
    ('dangling link', QUICK + ['--checkpoint-dir', 'dangling'], {}, 2, 'symbolic link to nothing'),
    ('absurd IDX header', QUICK, {}, 2, 't10k-images-idx3-ubyte.gz'),
    ('file size limit', QUICK + ['--checkpoint-dir', 'c'], {}, 1, 'could not write'),
]


@pytest.mark.parametrize('name, args, env, status, phrase', CASES, ids=[c[0] for c in CASES])
def test_a_hostile_input_is_one_line_and_loses_nothing(fashion_dir, tmp_path, name, args, env,
                                                       status, phrase):
    work, tmp = tmp_path / 'work', tmp_path / 'tmp'
    work.mkdir()
    tmp.mkdir()
    (work / 'mine.txt').write_text('the user\'s own file')
    (work / 'dangling').symlink_to(work / 'gone')
    data = bad_header_dir(tmp_path, fashion_dir) if name == 'absurd IDX header' else fashion_dir
    environ = dict(os.environ, TMPDIR=str(tmp), **env)
    command = [sys.executable, SCRIPT, *args, '--data-dir', str(data)]
    proc = run_bounded(limited(command, FSIZE=200_000) if name == 'file size limit' else command,
                       cwd=work, env=environ)
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1 and 'Traceback' not in proc.stderr, proc.stderr
    assert phrase in proc.stderr, proc.stderr
    assert sorted(os.listdir(work)) == ['dangling', 'mine.txt']
    assert (work / 'mine.txt').read_text() == 'the user\'s own file'
    assert os.listdir(tmp) == []

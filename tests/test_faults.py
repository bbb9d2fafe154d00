"""Fault injection: random SIGKILLs of a checkpointed run, and every hostile input of the CLI.

A killed run resumed with --resume must end with the same history and
parameters as a run never killed (or stop with one clear line); a hostile
input must end with its exit status, one line on stderr, no traceback,
nothing of the user's deleted, and nothing left in the temporary folder.
"""
import gzip
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_bounded, wait_bounded
from test_checkpoint import assert_same_run, manifest

pytestmark = pytest.mark.slow  # subprocesses or real training: the full suite's

SCRIPT = str(REPO / 'scripts' / 'train.py')


def argv(fashion_dir, ckpt, *extra):
    # about 15 s of work: 12 epochs of 60 steps, each saved
    return ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '12', '--num-train',
            '1920', '--num-test', '300', '--batch-size', '32', '--lr', '0.1', '--data-dir',
            str(fashion_dir), '--checkpoint-dir', str(ckpt), '--progress-interval', '0',
            *map(str, extra)]


@pytest.mark.slow
def test_random_sigkills_then_resume_reach_the_uninterrupted_result(fashion_dir, tmp_path):
    whole = tmp_path / 'whole'
    assert run_bounded([sys.executable, SCRIPT, *argv(fashion_dir, whole)]).returncode == 0
    ckpt = tmp_path / 'ckpt'
    rng = random.Random(1234)  # the same kill times on every run of the test
    kills = 0
    for attempt in range(10):
        extra = ['--resume'] if attempt else []
        proc = subprocess.Popen([sys.executable, SCRIPT, *argv(fashion_dir, ckpt, *extra)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(1.5, 7.0))  # start-up, loading, training, saving: anywhere
        proc.send_signal(signal.SIGKILL)
        status = wait_bounded(proc)
        err = proc.stderr.read()
        assert 'Traceback' not in err, err
        if status == 0:
            break  # it finished before the kill
        kills += 1
        assert status == -signal.SIGKILL
        if (ckpt / 'manifest.json').exists():
            assert manifest(ckpt)['format'] == 'gluon-multigpu-checkpoint-1'
    final = run_bounded([sys.executable, SCRIPT, *argv(fashion_dir, ckpt, '--resume')])
    assert final.returncode == 0, final.stderr
    assert kills >= 3, kills  # the test killed runs, not only watched them finish
    assert_same_run(ckpt, whole)
    assert sorted(os.listdir(ckpt)) == ['ckpt-%06d.params' % manifest(ckpt)['sequence'],
                                        'ckpt-%06d.states' % manifest(ckpt)['sequence'],
                                        'manifest.json']


def bad_header_dir(base, fashion_dir):
    d = base / 'header'
    shutil.copytree(fashion_dir, d)
    with gzip.open(d / 't10k-images-idx3-ubyte.gz', 'wb') as f:  # dimensions past 2**64
        f.write(b'\x00\x00\x08\x03' + b'\xff\xff\xff\xff' * 3)
    return d


def limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


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
    proc = run_bounded([sys.executable, SCRIPT, *args, '--data-dir', str(data)], cwd=work,
                       env=environ,
                       preexec_fn=limit_file_size if name == 'file size limit' else None)
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1 and 'Traceback' not in proc.stderr, proc.stderr
    assert phrase in proc.stderr, proc.stderr
    assert sorted(os.listdir(work)) == ['dangling', 'mine.txt']
    assert (work / 'mine.txt').read_text() == 'the user\'s own file'
    assert os.listdir(tmp) == []

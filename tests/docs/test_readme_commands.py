"""The README's "What to run next" commands, run as written from a fresh clone of this repository.

Each command runs in a clone (what CI and a new user have: the committed files
only) with ``../shared/data`` beside it, a home folder of its own (so MXNet's
default data folder does not exist) and the clone's package. A command that
can run on CPU gets flags appended that bound its size (the last value of a
flag wins), and must end with status 0; one that needs GPUs (``--num-gpus``)
must, on a machine without them, stop with one line that says so, status 2.
"""
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import gluon_multigpu as gm
from conftest import DATA, REPO, run_bounded

#: Flags appended to each program's command to bound its size and time.
BOUNDS = {
    'train': ['--num-epochs', '1', '--num-train', '512', '--num-test', '256',
              '--progress-interval', '0'],
    'bandwidth': ['--quick', '--counts', '2', '--models', 'simple-cnn'],
    'scaling': ['--model', 'simple-cnn', '--counts', '1', '2', '--steps', '2', '--num-epochs',
                '1', '--num-train', '128', '--num-test', '64', '--compute-repeats', '1',
                '--sync-repeats', '1', '--progress-interval', '0'],
    'balance': ['--steps', '8', '--rounds', '1', '--scenarios', 'equal'],
    'demo': [],
}
#: The programs that read the data set: their commands must say where it is.
READS_DATA = ('train', 'bandwidth', 'scaling', 'balance')
DATA_DIR = ['--data-dir', '../shared/data/fashion-mnist']


def next_commands(text):
    """The commands of the README's "What to run next" block, each as a list of words."""
    block = re.search(r'^## What to run next\n\n```sh\n(.*?)^```', text, re.S | re.M)
    assert block, 'README.md has no "What to run next" block of sh commands'
    commands = []
    for line in block.group(1).replace('\\\n', ' ').splitlines():
        command = line.split(' #', 1)[0].strip()  # a comment after the command, or alone
        if command and not command.startswith('#'):
            commands.append(shlex.split(command))
    return commands


def program(words):
    """``train`` for ``python scripts/train.py ...``: the program a command runs."""
    assert words[0] == 'python' and words[1].startswith('scripts/'), words
    return pathlib.Path(words[1]).stem


def bounded(words):
    """The command with this interpreter for ``python`` and its size bounded (``BOUNDS``).

    A launcher's command bounds the worker's command, which ends it.
    """
    extra = BOUNDS[program(worker(words) or words)]
    return [sys.executable if w == 'python' else w for w in words] + extra


def worker(words):
    """The command a launcher's command starts (after ``--``), or None."""
    return words[words.index('--') + 1:] if program(words) == 'launch' else None


COMMANDS = next_commands((REPO / 'README.md').read_text())


def test_the_block_holds_every_program_and_says_where_the_data_is():
    assert {program(c) for c in COMMANDS} >= {'train', 'bandwidth', 'scaling', 'balance', 'demo',
                                             'launch'}
    for words in COMMANDS:
        part = worker(words) or words
        if program(part) in READS_DATA:  # MXNet's default folder need not exist
            assert any(part[i:i + 2] == DATA_DIR for i in range(len(part))), \
                f'{shlex.join(words)} does not name {shlex.join(DATA_DIR)}'


@pytest.fixture(scope='module')
def clone(tmp_path_factory):
    """A fresh clone of this repository with ``../shared/data`` beside it, and an empty home."""
    root = tmp_path_factory.mktemp('fresh')
    checkout = root / 'checkout'
    if (REPO / '.git').exists():  # the committed files, as CI and a new user get them
        subprocess.run(['git', 'clone', '--quiet', str(REPO), str(checkout)], check=True,
                       timeout=120)
    else:  # an exported tree (no git): its files as they are
        shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(
            '.venv', '__pycache__', '*.egg-info', '.pytest_cache'))
    (root / 'shared').mkdir()
    (root / 'shared' / 'data').symlink_to(DATA.resolve())
    (root / 'home').mkdir()
    return checkout


def environment(clone):
    """A new user's environment: the clone's package, a home without ~/.mxnet, no engine
    settings of this test process."""
    env = {k: v for k, v in os.environ.items()
           if k not in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY', 'MXNET_HOME',
                        'GLUON_MULTIGPU_DATA')}
    env.update(PYTHONPATH=str(clone), HOME=str(clone.parent / 'home'))
    return env


@pytest.mark.slow
@pytest.mark.parametrize('words', COMMANDS, ids=[f'{i}-{program(c)}' for i, c in
                                                 enumerate(COMMANDS)])
def test_a_next_command_runs_as_written_from_a_fresh_clone(clone, words):
    if '--num-gpus' in words:
        if gm.num_gpus() > 0:
            pytest.skip('this machine has GPUs: the command would train for real (long)')
        proc = run_bounded([sys.executable if w == 'python' else w for w in words],
                           timeout=120, cwd=clone, env=environment(clone))
        wanted = int(words[words.index('--num-gpus') + 1])
        assert proc.returncode == 2 and proc.stdout == '', (proc.returncode, proc.stderr)
        assert proc.stderr == (f'error: {wanted} GPU(s) requested but none is available (no GPU, '
                               'or a CPU build of MXNet), or use --cpu-devices '
                               f'{wanted} to run the same code on CPU contexts\n'), proc.stderr
        return
    proc = run_bounded(bounded(words), timeout=150, cwd=clone, env=environment(clone))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    if '--report' in words:
        assert (clone / words[words.index('--report') + 1] / 'report.md').is_file()
    if '--out' in words:
        assert (clone / words[words.index('--out') + 1] / 'report.md').is_file()
    if program(words) == 'train':
        assert re.search(r'^test acc: 0\.\d\d, ', proc.stdout, re.M), proc.stdout

"""The README's two fresh-machine commands, and CI running the very same test command."""
import json
import os
import re
import sys

import numpy as onp

import pytest

from conftest import REPO, run_bounded


def readme_commands():
    text = (REPO / 'README.md').read_text()
    first_block = re.search(r'```(?:sh|bash)?\n(.*?)```', text, re.S).group(1)
    return [l for l in first_block.splitlines() if l.strip() and not l.startswith('#')]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert 'scripts/train.py' in main_job and 'pip install -e .' in main_job
    assert tests.endswith('python -m pytest -q')


def test_ci_runs_the_readme_test_command():
    ci = (REPO / '.ci' / 'run').read_text().splitlines()
    assert readme_commands()[1] in ci


def readme_python():
    """The README's Python block: the main job from a Python session."""
    text = (REPO / 'README.md').read_text()
    return re.search(r'```python\n(.*?)```', text, re.S).group(1)


def test_readme_python_is_the_main_job_in_at_most_six_lines():
    lines = [l for l in readme_python().splitlines() if l.strip()]
    assert len(lines) <= 6
    assert 'gm.train(gm.simple_cnn()' in readme_python() and 'num_epochs=2' in readme_python()


#: The size bound of the runs below: 2 epochs of 1,280 training and 256 test images, 10 steps
#: of the main job's batch of 128 an epoch (the README's are of all 60,000 and 10,000: about 80
#: CPU-seconds, a tenth of this suite's share of two cores; its figures are the main job's,
#: which prints them). What the test compares, every figure of every epoch of two processes,
#: does not depend on the size (a recipe other than the script's differs from the first epoch
#: on); 6,400 and 1,000 took twice as long.
BOUND = {'num_train': 1280, 'num_test': 256}


@pytest.mark.slow
def test_readme_python_in_a_fresh_session_trains_as_the_main_job(fashion_dir, tmp_path):
    """The Python block, as written but for the size bound, computes what the main job does.

    Both run in a new session's environment, the block with ``python -c``, the main job's
    command with the same bound: every figure of every epoch is the same (the library's
    natural call takes the script's recipe: with the book's Normal(0.01) and lr 0.1 the
    block reached 0.73 where the script reaches 0.85).
    """
    bound = ', '.join(f'{k}={v}' for k, v in BOUND.items())
    code = readme_python().replace("root='../shared/data/fashion-mnist'",
                                   f'root={str(fashion_dir)!r}, {bound}')
    assert bound in code, 'the README block no longer loads the data as this test expects'
    code += ('import json\nprint(json.dumps([[e.train_loss, e.train_acc, e.test_acc] '
             'for e in result.epochs]))\n')
    env = {k: v for k, v in os.environ.items()
           if k not in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY')}  # what a new session has
    block = run_bounded([sys.executable, '-c', code], cwd=tmp_path, env=env)
    assert block.returncode == 0, block.stderr
    line, figures = block.stdout.splitlines()
    assert re.fullmatch(r'test acc: \d\.\d\d, [\d.]+ sec/epoch on \[cpu\(0\), cpu\(1\)\]', line)

    main_job = readme_commands()[0].split(' && ')[-1].split()  # python scripts/train.py ...
    main_job = [sys.executable if w == 'python' else str(REPO / w) if w.startswith('scripts/')
                else str(fashion_dir) if w == '../shared/data/fashion-mnist' else w
                for w in main_job]
    script = run_bounded(main_job + ['--num-train', str(BOUND['num_train']), '--num-test',
                                     str(BOUND['num_test']), '--json', str(tmp_path / 'run.json'),
                                     '--progress-interval', '0'], cwd=tmp_path, env=env)
    assert script.returncode == 0, script.stderr
    assert script.stdout.splitlines()[-1].split(',')[0] == line.split(',')[0]  # test acc: 0.xx
    epochs = json.loads((tmp_path / 'run.json').read_text())['runs'][0]['epochs']
    expected = [[e['train_loss'], e['train_acc'], e['test_acc']] for e in epochs]
    assert len(expected) == 2
    # the same computation in two processes of the same settings: equal to rounding
    onp.testing.assert_allclose(json.loads(figures), expected, rtol=1e-5, atol=1e-6)

"""Every command block of README.md, docs/*.md and the notebook: run by the tests, or marked.

**Which blocks hold commands.** A fenced block tagged ``sh``, ``bash``, ``console`` or
``python`` holds commands (shell lines, or Python to run). Any other fenced block (untagged, or
``text``) is what a program prints, or a drawing: it may hold no command, so no line of it
starts with a command word (``COMMAND_WORDS``: ``python``, ``pip``, ``sbatch``, ``$ ``, ...).

**What becomes of each command block**, one of three, told by its first line (without a
comment after it):

- run here (``RUNS``), as written, with flags appended that bound its size where it would take
  long (the last value of a flag wins), in this process (``load_script(name).main(argv)``) from
  a folder with ``../shared/data`` beside it;
- run by another test (``COVERED``: the test named; a block whose commands are those of another
  block, bar the output folder or a default spelled out, shares that block's runs: ``SAME``);
- marked in the text as not run here and why: the first line after the block (or the last one
  before it) starts ``Not run here:`` (in italics or not) and gives the reason.

A block that is none of these fails ``test_every_command_block_is_run_or_marked``, and so does
an entry of these tables that no block has any more (they cannot go stale). The notebook's code
cells run end to end in a real kernel in ``tests/docs/test_notebook.py`` (not again here); its
markdown cells go by the rules above.
"""
import json
import os
import re
import shlex
import signal
import sys

import pytest

import gluon_multigpu as gm
from conftest import DATA, REPO, load_script, run_bounded

NOTEBOOK = 'notebooks/multiple_gpus_concise.ipynb'
COMMAND_TAGS = ('sh', 'bash', 'console', 'python')
#: The words a command line starts with: a block without a command tag may hold none of them.
COMMAND_WORDS = ('python', 'python3', 'pip', 'sbatch', 'salloc', 'srun', 'kubectl', 'docker',
                 'gluon-multigpu-', 'import ', '$ ')
MARK = re.compile(r'^\*?_?Not run here: \S.{9,}')


def doc_files():
    return ['README.md', *sorted(str(p.relative_to(REPO)) for p in (REPO / 'docs').glob('*.md'))]


def fenced(text, where):
    """``(where, line, tag, body, before, after)`` of every fenced block of markdown ``text``:
    ``before``/``after`` are the nearest non-blank lines outside it."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        opening = re.match(r'^(\s*)```(\S*)\s*$', lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == '```')
        before = next((l for l in reversed(lines[:i]) if l.strip()), '')
        after = next((l for l in lines[end + 1:] if l.strip()), '')
        blocks.append((where, i + 1, opening.group(2), '\n'.join(lines[i + 1:end]), before,
                       after))
        i = end + 1
    return blocks


def all_blocks():
    blocks = []
    for name in doc_files():
        blocks += fenced((REPO / name).read_text(), name)
    cells = json.loads((REPO / NOTEBOOK).read_text())['cells']
    for n, cell in enumerate(cells):
        if cell['cell_type'] == 'markdown':
            blocks += fenced(''.join(cell['source']), f'{NOTEBOOK} cell {n}')
    return blocks


def first_line(body):
    """A block's key: its first line, without a comment after it (figures there change)."""
    line = next(l for l in body.splitlines() if l.strip()).strip()
    return re.split(r'\s+# ', line, maxsplit=1)[0]


def commands(body):
    """The shell commands of a block, each as a list of words (continuations joined, comments
    dropped; ``[--flag]``, an optional word, kept as ``[--flag]``)."""
    out = []
    for line in body.replace('\\\n', ' ').splitlines():
        line = line.strip()
        line = re.sub(r'^\$ ', '', line)
        if line and not line.startswith('#'):
            out.append(shlex.split(line.split(' #', 1)[0]))
    return out


def code(body):
    """Python without its comments' text, to compare two blocks."""
    return [l.split('  #', 1)[0].rstrip() for l in body.splitlines() if l.strip()]


# -- the tables -----------------------------------------------------------------------------

#: (file, first line of the block) -> the tests that run its commands.
COVERED = {
    ('README.md', "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python "
     'scripts/train.py --cpu-devices 2 --model simple-cnn --num-epochs 2 --data-dir '
     '../shared/data/fashion-mnist'):
        ['tests/docs/test_readme.py::test_readme_python_in_a_fresh_session_trains_as_the_main_job',
         # line 2 is .ci/run's last line (so CI installs and runs the suite as written);
         # line 1's install is line 2's without the test extra
         'tests/docs/test_readme.py::test_ci_runs_the_readme_test_command'],
    ('README.md', 'import gluon_multigpu as gm'):
        ['tests/docs/test_readme.py::test_readme_python_in_a_fresh_session_trains_as_the_main_job'],
    # The NumPy 2 install: tools/runtimes.py installs with it (numpy-2, python-3.13) after the
    # suite in CI; the test ties the tool's line to this one
    ('README.md', "python3 -m venv .venv && . .venv/bin/activate && pip install 'numpy>=2' "
     "matplotlib requests && pip install --no-deps mxnet==1.9.1 -e '.'"):
        ['tests/docs/test_runtimes.py::test_the_install_lines_are_the_readmes'],
    ('README.md', 'python scripts/train.py --num-gpus 2 --data-dir ../shared/data/fashion-mnist'):
        ['tests/docs/test_readme_commands.py::test_a_next_command_runs_as_written_from_a_fresh_clone'],
    ('docs/distributed.md', 'sbatch --nodes=3 examples/slurm/train.sbatch --kvstore dist_sync '
     '--cpu-devices 1 \\'):
        ['tests/launch/test_slurm.py::test_sbatch_trains_on_every_node_and_prints_the_book_line'],
    ('docs/distributed.md', 'salloc --nodes=3 python scripts/launch.py -n 3 -s 3 --launcher '
     'slurm -- \\'):
        ['tests/launch/test_slurm.py::test_salloc_then_the_launcher_runs_the_roles_as_job_steps',
         'tests/launch/test_slurm.py::test_sbatch_trains_on_every_node_and_prints_the_book_line'],
    ('docs/distributed.md', 'python scripts/failover.py --data-dir ../shared/data/fashion-mnist '
     '--out /tmp/faults'):
        ['tests/lab/test_failover.py::test_a_worker_killed_is_detected_at_once_and_the_restarted_job'
         '_ends_as_the_uninterrupted'],
    ('docs/guide.md', 'python tests/fault_harness.py --table'):
        ['tests/outputs/test_fault_harness.py::test_docs_guide_holds_the_table_the_harness_makes',
         'tests/outputs/test_fault_harness.py::test_an_entry_point_keeps_the_old_state_or_makes_the_new_'
         'one'],  # and its third line is the suite's own file
}

#: (file, first line) -> (the block whose commands these are, the flags that may differ: an
#: output folder, or a default spelled out). Python blocks: the same code but for comments.
SAME = {
    ('docs/guide.md', 'import gluon_multigpu as gm'):
        (('README.md', 'import gluon_multigpu as gm'), ()),
    ('docs/results.md', 'python scripts/train.py --cpu-devices 2 --model simple-cnn --num-epochs '
     '4 --kvstore local device none \\'):
        # (the README's is sized to a few minutes: 2 epochs each where the results ran 4)
        (('README.md', 'python scripts/train.py --num-gpus 2 --data-dir '
          '../shared/data/fashion-mnist'), ('--report', '--num-epochs')),
    ('docs/distributed.md', 'python scripts/launch.py -n 2 -s 1 --launcher local -- \\'):
        (('README.md', 'python scripts/train.py --num-gpus 2 --data-dir '
          '../shared/data/fashion-mnist'), ('--launcher',)),
}

#: Flags appended to a program's command to bound its size (ResNet-18 runs: fewer images). A
#: comparison or a sweep is cut to one kvstore, one learning-rate rule, two device counts and
#: one scenario: its other runs are the same code with another value, and the README's
#: comparison of three kvstores runs whole in tests/docs/test_readme_commands.py.
BOUNDS = {
    'train': ['--num-train', '256', '--num-test', '64', '--num-epochs', '1',
              '--progress-interval', '0'],
    'balance': ['--steps', '4', '--every', '2', '--rounds', '1', '--scenarios', 'equal'],
    'bfloat16': ['--models', 'simple-cnn', '--rounds', '1', '--steps', '1'],
    'scaling': ['--counts', '1', '2', '--num-epochs', '1', '--num-train', '128', '--num-test',
                '64', '--compute-repeats', '1', '--sync-repeats', '1', '--progress-interval', '0',
                '--lr-rule', 'linear', '--kvstores', 'device'],
}
#: (ResNet-18 trains 8 images: one step, its batch cut to them. On 4 contexts with synchronised
#: BatchNorm, the largest of these runs, batch 8 needs about 2.0 GB by the programs' estimate;
#: 32 images, batch 32, needed 2.7 GB and were refused where 2.1 GB were free. One step, not
#: several of a smaller batch: each step of synchronised BatchNorm on CPU contexts risks the
#: race docs/exercises.md tells of.)
RESNET_BOUNDS = {'train': ['--num-train', '8', '--num-test', '16', '--kvstore', 'device'],
                 'balance': ['--batch-size', '4'],
                 'scaling': ['--num-train', '16', '--num-test', '16', '--batch-per-device', '8']}


def program(words):
    assert words[0] == 'python' and words[1].startswith('scripts/'), words
    return words[1][len('scripts/'):-len('.py')]


def bounded(words, extra=()):
    name = program(words)
    more = RESNET_BOUNDS.get(name, []) if 'resnet18' in words else []
    return words[2:] + BOUNDS[name] + more + list(extra)


def variants(words):
    """``[--flag]`` is optional: the command without it and with it."""
    optional = [w for w in words if re.fullmatch(r'\[\S+\]', w)]
    plain = [w for w in words if w not in optional]
    return [plain] + ([plain + [w[1:-1] for w in optional]] if optional else [])


#: The most memory a command bounded here may need by its program's estimate: ResNet-18 on 4
#: contexts with synchronised BatchNorm, batch 8, needs about 2.0 GB (``RESNET_BOUNDS``).
BOUNDED_MEMORY = 2.5e9
#: A program's refusal of a batch for the memory the machine has free (``model.check_memory``,
#: made before any work): the need and what is available.
REFUSED_FOR_MEMORY = re.compile(r'needs about ([\d.]+) (GB|MB) of memory for .*?and ([\d.]+) '
                                r'(GB|MB) is available')


def skip_if_short_of_memory(words, err):
    """Skip, saying it is the machine's, where the program refused its batch for the memory the
    machine has free while a bounded command's need is in reason (``BOUNDED_MEMORY``). A need
    beyond that is the package's or this test's doing: no skip, the test fails."""
    refused = REFUSED_FOR_MEMORY.search(err)
    if refused is None:
        return
    need = float(refused.group(1)) * (1e9 if refused.group(2) == 'GB' else 1e6)
    free = float(refused.group(3)) * (1e9 if refused.group(4) == 'GB' else 1e6)
    if free < need <= BOUNDED_MEMORY:
        pytest.skip(f"the machine's memory, not the package's: {' '.join(words[:2])} checked the "
                    f'memory before any work and refused its batch: it needs about '
                    f'{need / 1e9:.1f} GB and this machine had {free / 1e9:.1f} GB available '
                    '(other programs hold the rest); run the suite where more is free')


def main_of(words, argv, capsys=None):
    """Run the program of ``words`` on ``argv`` in this process; it must succeed, or refuse for
    the machine's memory (``skip_if_short_of_memory``).

    With ``--sync-bn`` in a process of its own: MXNet's scratch spaces for synchronised
    BatchNorm are set before it loads (this process has loaded it with other settings).
    """
    if '--sync-bn' in argv:
        env = {k: v for k, v in os.environ.items()
               if k not in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY')}  # a new shell's
        env['PYTHONPATH'] = str(REPO)
        proc = run_bounded([sys.executable, str(REPO / words[1]), *argv], env=env)
        if proc.returncode != 0:
            skip_if_short_of_memory(words, proc.stderr)
        assert proc.returncode == 0, (words, proc.returncode, proc.stderr[-2000:])
        return
    status = load_script(program(words)).main(argv)
    if status not in (0, None):
        err = capsys.readouterr().err if capsys else ''
        skip_if_short_of_memory(words, err)
        raise AssertionError((words, status, err[-2000:]))


# -- the runs --------------------------------------------------------------------------------

def run_shell(block, capsys):
    """Each command, bounded, in turn (a ``[--flag]`` both without and with it)."""
    for words in commands(block):
        for each in variants(words):
            main_of(each, bounded(each), capsys)


def run_checkpoint_example(block, capsys):
    """The ^C is played by a first run of 1 epoch; the resume on 4 devices trains the second."""
    first, resume = commands(block)
    main_of(first, bounded(first), capsys)
    main_of(resume, bounded(resume, ['--num-epochs', '2']), capsys)
    out = capsys.readouterr().out
    assert 'resuming' in out and re.search(r'^epoch 2/2: ', out, re.M), out
    assert out.rstrip().endswith('on [cpu(0), cpu(1), cpu(2), cpu(3)]'), out


def run_bfloat16(block, capsys):
    """The CPU computes in bfloat16 (status 0) or says in one line that it cannot (status 2)."""
    (words,) = commands(block)
    status = load_script('bfloat16').main(bounded(words))
    err = capsys.readouterr().err
    assert status in (0, None) or (status == 2 and 'cannot compute in bfloat16' in err), err


def python_setup(num_train=128, num_test=64):
    """The guide's first Python block (the README's) up to its training, on fewer images."""
    body = block_of(('docs/guide.md', 'import gluon_multigpu as gm'))
    setup = body.split('result = ')[0]
    bound = f"root='../shared/data/fashion-mnist', num_train={num_train}, num_test={num_test}"
    assert "root='../shared/data/fashion-mnist'" in setup
    return setup.replace("root='../shared/data/fashion-mnist'", bound)


def run_checkpointer(block, capsys):
    """The Checkpointer block after the setup (32 images: one step of ResNet-18), 1 epoch
    where it says 10."""
    assert block.count('num_epochs=10') == 2
    space = {}
    exec(python_setup(32, 16) + block.replace('num_epochs=10', 'num_epochs=1'), space)
    assert space['result'].epochs[-1].epoch == 1 and os.path.isfile('ckpt/manifest.json')


class PressStop(gm.Hook):
    """The stop button, once, in the first step of epoch 7."""
    pressed = False

    def step_end(self, run, step, samples, timer):
        if run.epoch == 7 and not self.pressed:
            PressStop.pressed = True
            os.kill(os.getpid(), signal.SIGINT)


def run_fit_block(block, capsys):
    """The Training block after the setup, the stop button pressed in epoch 7."""
    space = {}
    exec(python_setup(), space)

    class WithStop:  # gm, but a Training gets the stop button
        def __getattr__(self, name):
            return getattr(gm, name)

        @staticmethod
        def Training(*args, **kwargs):  # pylint: disable=invalid-name
            return gm.Training(*args, hooks=[PressStop()], **kwargs)
    space['gm'] = WithStop()
    PressStop.pressed = False
    exec(block, space)
    assert PressStop.pressed
    assert [r.epoch for r in space['run'].result.epochs] == list(range(1, 11))
    assert [r.epoch for r in space['result'].training.result.epochs] == [1, 2, 3]


def run_metrics_example(block, capsys):
    """The run, bounded: its JSON lines end with the epoch's record, and runs/ has an event file."""
    run_shell(block, capsys)
    with open('metrics.jsonl', encoding='utf-8') as f:
        last = json.loads(f.read().splitlines()[-1])
    assert (last['kind'], last['epoch']) == ('epoch', 1) and 'train_loss' in last['values']
    assert any(name.startswith('events.out.tfevents.') for name in os.listdir('runs'))


def run_updates_example(block, capsys):
    """The run, bounded: --json holds each update's rate (the warm-up's) and its norm."""
    run_shell(block, capsys)
    with open('run.json', encoding='utf-8') as f:
        epoch = json.load(f)['runs'][0]['epochs'][0]
    assert len(epoch['rates']) == len(epoch['grad_norms']) == 1  # 256 images: 2 batches, 1 update
    assert epoch['rates'][0] == pytest.approx(0.3 / 20)  # the first of 20 warm-up updates


def run_profile_example(block, capsys):
    """The run on 3840 images (30 steps of 128, the range's last step 30): the trace is written
    and the table printed."""
    (words,) = commands(block)
    main_of(words, bounded(words, ['--num-train', '3840']), capsys)
    assert 'profile of steps 21-30 on cpu(0), cpu(1): written to profile.json' in \
        capsys.readouterr().out
    with open('profile.json', encoding='utf-8') as f:
        assert json.load(f)['otherData']['profiled'] == '21:30'


#: (file, first line) -> how this test runs the block.
RUNS = {
    ('docs/guide.md', 'python scripts/train.py --cpu-devices 2 --model simple-cnn --batch-size '
     '128 --checkpoint-dir ckpt --data-dir ../shared/data/fashion-mnist'): run_checkpoint_example,
    ('docs/guide.md', "ckpt = gm.Checkpointer('ckpt', {'model': 'resnet18', 'batch_size': 512, "
     "'lr': 0.2, 'seed': 0},"): run_checkpointer,
    ('docs/guide.md', 'run = gm.Training(gm.simple_cnn(), train_iter, test_iter, devices)'):
        run_fit_block,
    ('docs/guide.md', 'python scripts/train.py --cpu-devices 2 --model simple-cnn --num-epochs 1 '
     '--profile 21:30 --data-dir ../shared/data/fashion-mnist'): run_profile_example,
    ('docs/guide.md', 'python scripts/train.py --cpu-devices 2 --model simple-cnn --num-epochs 2 '
     '--tensorboard runs --metrics metrics.jsonl --log-every 50 --data-dir '
     '../shared/data/fashion-mnist'): run_metrics_example,
    ('docs/guide.md', 'python scripts/train.py --cpu-devices 2 --model simple-cnn --num-epochs 4 '
     '--accumulate 4 --clip-grad-norm 1 --lr-schedule cosine --warmup-steps 20 --json run.json '
     '--data-dir ../shared/data/fashion-mnist'): run_updates_example,
    ('docs/guide.md', 'python scripts/train.py --cpu-devices 2 --model simple-cnn --num-epochs 2 '
     '--stall-timeout 60 --data-dir ../shared/data/fashion-mnist'): run_shell,
    ('docs/exercises.md', 'python scripts/balance.py --out docs/results/balance-simple-cnn'): run_shell,
    ('docs/exercises.md', 'python scripts/balance.py --model resnet18 --scenarios equal busy '
     '--rounds 3 \\'): run_shell,
    ('docs/exercises.md', 'python scripts/train.py --cpu-devices 4 --model resnet18 --batch-size '
     '64 --num-train 3072 \\'): run_shell,
    ('docs/exercises.md', 'python scripts/bfloat16.py --rounds 5 --data-dir '
     '../shared/data/fashion-mnist'): run_bfloat16,
    ('docs/results.md', 'python scripts/train.py --cpu-devices 2 --model resnet18 --num-epochs 4 '
     '--num-train 1536 --num-test 1000 \\'): run_shell,
    ('docs/results.md', 'python scripts/scaling.py --full --cpu-devices 4 --model simple-cnn '
     '--num-epochs 2 --batch-per-device 128 \\'): run_shell,
}


def command_blocks():
    return [b for b in all_blocks() if b[2] in COMMAND_TAGS]


def block_of(key):
    found = [b[3] for b in command_blocks() if (b[0], first_line(b[3])) == key]
    assert len(found) == 1, f'{key[0]}: {len(found)} command blocks start {key[1]!r}'
    return found[0]


# -- the tests -------------------------------------------------------------------------------

def test_a_block_without_a_command_tag_holds_no_command():
    for where, line, tag, body, _, _ in all_blocks():
        if tag in COMMAND_TAGS:
            continue
        for text in body.splitlines():
            assert not text.lstrip().startswith(COMMAND_WORDS), (
                f'{where}:{line}: a block tagged {tag or "nothing"} holds a command '
                f'({text.strip()!r}): tag it sh or python, and run or mark it')


def test_every_command_block_is_run_or_marked():
    unclaimed = []
    for where, line, _, body, before, after in command_blocks():
        key = (where, first_line(body))
        claims = [key in COVERED, key in SAME, key in RUNS,
                  bool(MARK.match(after.strip()) or MARK.match(before.strip()))]
        if sum(claims) != 1:
            unclaimed.append(f'{where}:{line}: {key[1]!r} is '
                             f'{"claimed twice" if sum(claims) else "neither run nor marked"}')
    assert not unclaimed, '\n'.join(unclaimed)
    keys = {(b[0], first_line(b[3])) for b in command_blocks()}
    stale = [k for k in (*COVERED, *SAME, *RUNS, *(v[0] for v in SAME.values())) if k not in keys]
    assert not stale, f'entries of no block any more: {stale}'


def test_the_covering_tests_exist():
    for key, tests in COVERED.items():
        for test in tests:
            path, name = test.split('::')
            assert re.search(rf'^def {name}\(', (REPO / path).read_text(), re.M), (key, test)


def words_but(words, flags):
    """``words`` without each of ``flags`` and its value."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in flags:
            skip = True
        else:
            out.append(w)
    return out


def normal(words):
    """A command as its program and its set of (flag, values): the order of flags aside."""
    head, options, current = words[:2], [], None
    for w in words[2:]:
        if w.startswith('--') or w == '-n' or w == '-s':
            current = [w]
            options.append(current)
        elif current is not None:
            current.append(w)
        else:
            head.append(w)
    return head, sorted(tuple(o) for o in options)


def test_a_block_that_shares_runs_has_the_commands_of_its_block():
    for key, (other, flags) in SAME.items():
        body, theirs = block_of(key), block_of(other)
        if key[1].startswith('import '):
            assert code(body) == code(theirs), key
            continue
        for words in commands(body):
            parts = ' '.join(words).split(' -- ')
            wanted = [normal(words_but(p.split(), flags)) for p in parts]
            assert any([normal(words_but(p.split(), flags))
                        for p in ' '.join(w).split(' -- ')] == wanted
                       for w in commands(theirs)), (key, words)


def test_the_bounded_runs_need_what_bounded_memory_allows():
    # The largest: ResNet-18 on 4 contexts with synchronised BatchNorm (docs/exercises.md)
    assert 'resnet18' in ' '.join(k[1] for k in RUNS)
    # (a batch larger than the training images is cut to them: scripts/train.py)
    batch = int(RESNET_BOUNDS['train'][RESNET_BOUNDS['train'].index('--num-train') + 1])
    assert gm.model.memory_needed('resnet18', batch, 4, sync_bn=True) <= BOUNDED_MEMORY


def refusal(need_batch, available):
    """The package's refusal of a ResNet-18 batch on 4 contexts with synchronised BatchNorm."""
    with pytest.raises(gm.DeviceError) as refused:
        gm.model.check_memory('resnet18', need_batch, 4, available, 4, sync_bn=True)
    return str(refused.value)


def test_a_refusal_for_the_machines_memory_skips_saying_it_is_the_machines():
    with pytest.raises(pytest.skip.Exception) as skipped:
        skip_if_short_of_memory(['python', 'scripts/train.py'], 'error: ' + refusal(8, 1.5e9))
    said = str(skipped.value)
    assert said.startswith("the machine's memory, not the package's: python scripts/train.py ")
    assert 'needs about 2.0 GB and this machine had 1.5 GB available' in said
    # a need no bounded command has (the estimate or the bounds gone wrong): the test fails
    skip_if_short_of_memory(['python', 'scripts/train.py'], refusal(64, 2.1e9))
    skip_if_short_of_memory(['python', 'scripts/train.py'], 'error: something else')


def test_the_notebooks_code_cells_run_in_test_notebook():
    text = (REPO / 'tests' / 'docs' / 'test_notebook.py').read_text()
    assert "'multiple_gpus_concise.ipynb'" in text
    assert 'def test_the_notebook_runs_end_to_end_in_a_real_kernel(' in text


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout's folder (``docs/results`` in it) with ``../shared/data`` beside it, the
    current one for the test."""
    (tmp_path / 'shared').mkdir()
    (tmp_path / 'shared' / 'data').symlink_to(DATA.resolve())
    (tmp_path / 'checkout' / 'docs' / 'results').mkdir(parents=True)  # as in a clone
    monkeypatch.chdir(tmp_path / 'checkout')
    return tmp_path / 'checkout'


@pytest.mark.slow
@pytest.mark.parametrize('key', list(RUNS), ids=[f'{k[0]}-{i}' for i, k in enumerate(RUNS)])
def test_a_command_block_runs_as_written_bounded(key, checkout, capsys):
    RUNS[key](block_of(key), capsys)

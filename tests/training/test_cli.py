"""scripts/train.py end to end on a small real subset, and its answers to bad input."""
import argparse
import gzip
import json
import os
import re
import shutil
import sys

import pytest

import gluon_multigpu as gm
from conftest import REPO, load_script, run_bounded

# A quick run on real data: what bad output paths are added to (the run would succeed without).
QUICK = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1', '--num-train', '64',
         '--num-test', '32', '--batch-size', '32', '--progress-interval', '0']

FINAL = re.compile(r'^test acc: (\d\.\d\d), (\d+\.\d) sec/epoch on \[cpu\(0\), cpu\(1\)\]$')


def assert_one_line_error(err, *phrases):
    """The project's answer to bad input: one line on stderr, no traceback, the phrases in it."""
    assert len(err.splitlines()) == 1, err
    assert 'Traceback' not in err
    for phrase in phrases:
        assert phrase in err, err


def run_script(*args, cwd=REPO):
    return run_bounded([sys.executable, str(REPO / 'scripts' / 'train.py'), *map(str, args)],
                          cwd=cwd, timeout=600)


@pytest.fixture(scope='module')
def train_script():
    return load_script('train')


@pytest.mark.slow
@pytest.mark.skipif(gm.num_gpus() > 0, reason='checks the fallback without a GPU')
def test_without_device_flags_it_uses_the_cpu_and_says_so(fashion_dir):
    proc = run_script('--model', 'simple-cnn', '--num-epochs', 1, '--num-train', 256,
                      '--num-test', 100, '--data-dir', fashion_dir, '--progress-interval', 0)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('no GPU found: training on the CPU; use --cpu-devices N')
    assert proc.stdout.rstrip().splitlines()[-1].endswith('sec/epoch on [cpu(0)]')


def test_progress_lines_during_an_epoch(train_script, fashion_dir, capsys):
    argv = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1',
            '--num-train', '512', '--num-test', '64', '--batch-size', '32',
            '--data-dir', str(fashion_dir), '--progress-interval', '0.000001']
    assert train_script.main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    # a line after every step but the first (the clock of the estimate starts with it)
    assert [int(re.match(r'  kvstore device on 2 CPUs: epoch 1: (\d+)/16 batches, \d+ images/s, '
                         r'epoch ends in \d+ s, run in \d+ s$', l).group(1))
            for l in err] == list(range(2, 17))


@pytest.mark.slow
def test_a_process_error_is_one_line_without_traceback():
    proc = run_script('--num-gpus', gm.num_gpus() + 1)
    assert proc.returncode == 2
    assert proc.stdout == '' and len(proc.stderr.splitlines()) == 1
    assert '--cpu-devices' in proc.stderr and 'Traceback' not in proc.stderr


@pytest.fixture(scope='module')
def corrupt_dirs(tmp_path_factory, fashion_dir):
    """Copies of the real data with one file damaged in each of several ways."""
    base = tmp_path_factory.mktemp('corrupt')
    dirs = {}

    def copy(name):
        d = base / name
        shutil.copytree(fashion_dir, d)
        return d
    d = copy('truncated')
    raw = (d / 't10k-images-idx3-ubyte.gz').read_bytes()
    (d / 't10k-images-idx3-ubyte.gz').write_bytes(raw[:1000])
    dirs['truncated'] = (d, 'not a complete gzip file')
    d = copy('garbage')  # e.g. an error page saved under the file's name
    (d / 't10k-labels-idx1-ubyte.gz').write_bytes(b'<html><body>404 Not Found</body></html>\n')
    dirs['garbage'] = (d, 't10k-labels-idx1-ubyte.gz is not a complete gzip file '
                          '\\(Not a gzipped file')
    d = copy('damaged')  # right length and header, four bytes of the stream flipped
    raw = bytearray((d / 't10k-labels-idx1-ubyte.gz').read_bytes())
    raw[len(raw) // 2:len(raw) // 2 + 4] = bytes(b ^ 0xFF for b in raw[len(raw) // 2:][:4])
    (d / 't10k-labels-idx1-ubyte.gz').write_bytes(bytes(raw))
    dirs['damaged'] = (d, 't10k-labels-idx1-ubyte.gz is not a complete gzip file')
    d = copy('magic')
    with gzip.open(d / 't10k-labels-idx1-ubyte.gz', 'wb') as f:
        f.write(b'\x12\x34\x08\x01' + (10000).to_bytes(4, 'big') + bytes(10000))
    dirs['magic'] = (d, 'not an IDX file \\(bad magic number 12340801\\)')
    d = copy('swapped')
    shutil.copy(d / 't10k-images-idx3-ubyte.gz', d / 't10k-labels-idx1-ubyte.gz')
    dirs['swapped'] = (d, 'must hold uint8 labels \\(N,\\), found uint8 \\(10000, 28, 28\\)')
    d = copy('counts')
    with gzip.open(d / 't10k-labels-idx1-ubyte.gz', 'wb') as f:
        f.write(b'\x00\x00\x08\x01' + (9999).to_bytes(4, 'big') + bytes(9999))
    dirs['counts'] = (d, 'holds 10000 images but .* holds 9999 labels')
    d = copy('missing')
    os.remove(d / 'train-labels-idx1-ubyte.gz')
    dirs['missing'] = (d, 'lacks train-labels-idx1-ubyte.gz; it must hold the four files')
    return dirs


DATA_HINTS = {'missing': 'point --data-dir at them, or pass --download',
              'counts': 'download both again'}


@pytest.mark.parametrize('case', ['truncated', 'garbage', 'damaged', 'magic', 'swapped',
                                  'counts', 'missing'])
def test_bad_data_directories_get_one_line_and_status_2(train_script, corrupt_dirs, case,
                                                        capsys, tmp_path):
    directory, message = corrupt_dirs[case]
    out = tmp_path / 'runs.json'
    status = train_script.main(['--cpu-devices', '2', '--data-dir', str(directory),
                                '--json', str(out)])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == '' and re.search(message, captured.err)
    assert_one_line_error(captured.err, DATA_HINTS.get(case, 'download it again'))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('argv, message', [
    (['--num-gpus', '64'], 'use --cpu-devices 64'),
    (['--cpu-devices', '3', '--batch-size', '2'], 'cannot be split across 3 devices; '
                                                  'use --batch-size 3 or more'),
    (['--cpu-devices', '2', '--data-dir', '/no/such/dir'], '/no/such/dir does not exist'),
    (['--cpu-devices', '2', '--json', '/no/such/dir/r.json'], 'does not exist; create it'),
    (['--cpu-devices', '2', '--plot', '/'], 'is a directory; give a file name'),
])
def test_bad_input_stops_with_status_2(train_script, argv, message, capsys):
    assert train_script.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ''
    assert_one_line_error(captured.err, message)


@pytest.mark.parametrize('flag, name', [('--json', 'r.json'), ('--plot', 'a.png')])
@pytest.mark.parametrize('where', ['no such directory', 'a directory', 'unwritable', 'proc'])
def test_output_paths_that_cannot_be_written_stop_before_training(
        train_script, fashion_dir, unwritable_dir, tmp_path, flag, name, where, capsys):
    # With real data: if the path were not refused at once, the run would train and succeed.
    path, message, hint = {
        'no such directory': (tmp_path / 'missing' / name, 'does not exist', 'create it first'),
        'a directory': (tmp_path, 'is a directory', 'give a file name'),
        'unwritable': (os.path.join(unwritable_dir, name), 'cannot create files in',
                       'choose a writable directory'),
        'proc': (f'/proc/{name}', 'cannot create files in /proc', 'choose a writable directory'),
    }[where]
    status = train_script.main(QUICK + ['--data-dir', str(fashion_dir), flag, str(path)])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ''
    assert_one_line_error(captured.err, f'{flag} {path}', message, hint)
    assert os.listdir(tmp_path) == (['read-only'] if os.geteuid() != 0 else [])
    assert not os.path.exists(path) or os.path.isdir(path)


@pytest.mark.slow
def test_an_unwritable_output_path_is_one_line_without_traceback(fashion_dir, tmp_path):
    # Once ended in a traceback after training: /proc passes os.access but takes no files.
    proc = run_script(*QUICK, '--data-dir', fashion_dir, '--json', '/proc/r.json', cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ''
    assert_one_line_error(proc.stderr, '--json /proc/r.json: cannot create files in /proc')
    assert os.listdir(tmp_path) == []


POSITIVE = 'give a number greater than 0 and at most 1e6'
NON_NEGATIVE = 'give a number from 0 to 1e6'


@pytest.mark.parametrize('argv, message, hint', [
    (['--cpu-devices', '0'], '--cpu-devices: 0 is not positive', 'a whole number from 1 to 64'),
    (['--cpu-devices', '-2'], '--cpu-devices: -2 is not positive', 'a whole number from 1 to 64'),
    (['--cpu-devices', '1000000000'], '--cpu-devices: 1000000000 is above 64',
     'a whole number from 1 to 64'),
    (['--num-gpus', '0'], '--num-gpus: 0 is not positive', 'a whole number from 1 to 64'),
    (['--batch-size', '0'], '--batch-size: 0 is not positive', 'a whole number from 1 to 1000000'),
    (['--batch-size', '10000000'], '--batch-size: 10000000 is above 1000000', 'from 1 to 1000000'),
    (['--num-gpus', '1', '--cpu-devices', '1'], 'not allowed with argument', 'see --help'),
    (['--kvstore', 'nccl2'], "invalid choice: 'nccl2'", "choose from 'local', 'device'"),
    (['--model', 'vgg'], "invalid choice: 'vgg'", "choose from 'resnet18', 'simple-cnn'"),
    (['--dataset', 'cifar'], "invalid choice: 'cifar'", "choose from 'fashion-mnist', 'mnist'"),
    (['--lr', 'nan'], 'nan is not a positive finite number', POSITIVE),
    (['--lr', '-0.1'], '-0.1 is not a positive finite number', POSITIVE),
    (['--lr', '1e300'], '1e300 is above 1e6', POSITIVE),
    (['--lr', 'fast'], "'fast' is not a number", POSITIVE),
    (['--num-epochs', '0'], '--num-epochs: 0 is not positive', 'a whole number from 1 to 100000'),
    (['--num-epochs', '-3'], '--num-epochs: -3 is not positive', 'from 1 to 100000'),
    (['--num-epochs', '2.5'], "--num-epochs: '2.5' is not an integer", 'from 1 to 100000'),
    (['--num-epochs', 'ten'], "'ten' is not an integer", 'from 1 to 100000'),
    (['--seed', '-1'], '--seed: -1 is negative', 'a whole number from 0 to 4294967295'),
    (['--seed', '-1e3'], "--seed: '-1e3' is not an integer", 'from 0 to 4294967295'),
    (['--cpu-devices', '-two'], "--cpu-devices: '-two' is not an integer", 'from 1 to 64'),
    (['--seed', str(2**32)], f'--seed: {2**32} is above 4294967295',
     'a whole number from 0 to 4294967295'),
    (['--progress-interval', '-1'], '-1 is not a finite number of 0 or more', NON_NEGATIVE),
    (['--progress-interval', 'nan'], 'nan is not a finite number of 0 or more', NON_NEGATIVE),
])
def test_bad_arguments_stop_with_status_2(train_script, argv, message, hint, capsys):
    with pytest.raises(SystemExit) as stop:
        train_script.main(argv)
    captured = capsys.readouterr()
    assert stop.value.code == 2 and captured.out == ''
    assert_one_line_error(captured.err, message, hint)
    assert captured.err.endswith('(see --help)\n')


@pytest.mark.slow
def test_bad_arguments_in_a_process_are_one_line_without_traceback(tmp_path):
    proc = run_script('--num-epochs', '2.5', '--json', 'r.json', cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ''
    assert_one_line_error(proc.stderr, "'2.5' is not an integer")
    assert os.listdir(tmp_path) == []


def test_divergence_leaves_no_output_files(train_script, fashion_dir, tmp_path, capsys):
    out, png = tmp_path / 'r.json', tmp_path / 'a.png'
    status = train_script.main(['--cpu-devices', '2', '--model', 'simple-cnn', '--lr', '10000',
                                '--num-train', '512', '--num-test', '64', '--batch-size', '64',
                                '--data-dir', str(fashion_dir), '--json', str(out),
                                '--plot', str(png)])
    err = capsys.readouterr().err
    assert status == 2 and 'lower the learning rate' in err
    assert os.listdir(tmp_path) == []


def test_help_states_units_and_defaults(train_script, capsys):
    with pytest.raises(SystemExit) as stop:
        train_script.main(['--help'])
    text = capsys.readouterr().out
    assert stop.value.code == 0
    for phrase in ('total batch size over all devices', '256 per device', '0.1 per 256 samples',
                   '--cpu-devices N', 'exit status 2'):
        assert phrase in ' '.join(text.split())


def test_book_literal_runs_the_texts_loop_to_the_same_figures(train_script, fashion_dir, capsys,
                                                               tmp_path):
    argv = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1', '--num-train',
            '512', '--num-test', '128', '--batch-size', '64', '--data-dir', str(fashion_dir),
            '--progress-interval', '0']
    assert train_script.main(argv + ['--json', str(tmp_path / 'fast.json')]) == 0
    fast = capsys.readouterr().out.splitlines()
    assert train_script.main(argv + ['--book-literal', '--json', str(tmp_path / 'book.json')]) == 0
    book = capsys.readouterr().out.splitlines()
    # the text's loop computes no training loss or accuracy: its epoch line has none
    assert re.match(r'epoch 1/1: test acc 0\.\d{3}, \d+\.\d s, \d+ samples/s$', book[1]), book[1]
    assert fast[1].startswith('epoch 1/1: loss ')
    # same data, initial weights and update: the same test accuracy (within one image)
    acc = [json.loads((tmp_path / f'{n}.json').read_text())['runs'][0]['epochs'][0]['test_acc']
           for n in ('fast', 'book')]
    assert abs(acc[0] - acc[1]) <= 1 / 128 + 1e-9
    assert FINAL.match(book[-1])


def test_book_literal_keeps_no_checkpoints(train_script, tmp_path, capsys):
    assert train_script.main(['--cpu-devices', '2', '--book-literal', '--checkpoint-dir',
                              str(tmp_path / 'c')]) == 2
    assert_one_line_error(capsys.readouterr().err, "runs the text's loop, which keeps no "
                          'checkpoints')
    assert os.listdir(tmp_path) == []


#: The launcher's library, whose messages name the launcher's own flags (the studies of the
#: programs themselves, which run scripts/launch.py and scripts/train.py with their flags across
#: a cluster, are the lab's, outside the package).
PROGRAM_STUDIES = ('multihost/plan.py', 'multihost/supervise.py', 'doctor.py')
#: What the train program does once parsed, library code since issue 51 (``runs``), whose lines
#: still name the train program's flags (``--plot``, ``--json``...): not yet its arguments.
PROGRAM_RUNS = 'runs'


def library_files():
    """The library's source files: the package but its command line (gluon_multigpu/cli, the
    doctor), the train program's runs (``PROGRAM_RUNS``) and the launcher's library
    (``PROGRAM_STUDIES``)."""
    package = REPO / 'gluon_multigpu'
    return [p for p in package.rglob('*.py')
            if p.relative_to(package).parts[0] not in ('cli', PROGRAM_RUNS)
            and p.relative_to(package).as_posix() not in PROGRAM_STUDIES]


def library_message_arguments():
    """The backquoted argument names in every message the library raises (read from its source)."""
    import ast
    names = set()
    for path in library_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Raise, ast.Call)) and (
                    isinstance(node, ast.Raise) or getattr(node.func, 'attr', '') == 'append'):
                for const in ast.walk(node):
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        names |= set(re.findall(r'(?<!`)`([a-z_]+(?:=True)?)`(?!`)', const.value))
    return names


def test_the_library_names_no_flag_and_the_cli_spells_every_argument_it_names():
    from gluon_multigpu.errors import flag
    names = library_message_arguments()
    assert {'checkpoint_dir', 'cpu_devices', 'resume=True', 'data_dir'} <= names  # it found them
    flags = program_flags()
    assert {flag(name) for name in names} <= flags, \
        {flag(name) for name in names} - flags
    for path in library_files():
        for node in ast_strings(path):
            # pip's own flags, in the pip commands the library prints for an MXNet that cannot
            # load (base.compat), are not the package's
            node = re.sub(r'pip install(\s+--[a-z-]+)*', 'pip install', node)
            assert not re.search(r'(^|\s)--[a-z]', node), (path.name, node)


def program_flags():
    """Every flag of the package's programs and the lab's, read from their parsers."""
    import importlib
    import pkgutil
    import lab.commands
    import gluon_multigpu.cli
    flags = set()
    for package in (gluon_multigpu.cli, lab.commands):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f'{package.__name__}.{info.name}')
            if callable(getattr(module, 'build_parser', None)):
                flags |= {o for a in module.build_parser()._actions for o in a.option_strings}
    return flags


def ast_strings(path):
    import ast
    return [n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and not n.value.startswith(('-', "'"))]


@pytest.mark.parametrize('argv, parsed', [
    (['--x', '-1:3'], ['--x=-1:3']),  # a value that looks like a flag is the flag's value
    (['-n', '2', '--x', '-y', 'cmd', '--x', '-z'], ['-n', '2', '--x=-y', 'cmd', '--x', '-z']),
    (['--x', '--on'], ['--x', '--on']),  # a flag of the parser stays one: 'expected one argument'
    (['--on', '--x=-3', '--', '--x', '-z'], ['--on', '--x=-3', '--', '--x', '-z']),
])
def test_a_value_beginning_with_a_dash_is_its_flags_value_up_to_the_command(argv, parsed):
    from gluon_multigpu.cli.arguments import OneLineParser
    p = OneLineParser(prog='t')
    p.add_argument('-n', type=int)
    p.add_argument('--x')
    p.add_argument('--on', action='store_true')
    p.add_argument('command', nargs=argparse.REMAINDER)
    assert p.values_joined(argv) == parsed

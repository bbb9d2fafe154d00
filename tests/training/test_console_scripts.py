"""The programs as an installed package has them: console scripts, the programs of scripts/.

``pip install -e .`` puts ``gluon-multigpu-NAME`` beside the Python it installs
into; ``scripts/NAME.py`` starts the same ``gluon_multigpu.cli.NAME`` from a
checkout, or the lab's ``lab.commands.NAME`` (not installed). Each sets MXNet's
engine variables for its device flags before MXNet loads, and exits with its
program's status.
"""
import importlib
import os
import pathlib
import re
import sys

import pytest

from gluon_multigpu.base import engine
from gluon_multigpu.cli import console
from conftest import REPO, run_bounded

#: The installed programs: console scripts, and scripts/NAME.py; each starts
#: ``gluon_multigpu.cli.NAME``, but the doctor, ``gluon_multigpu.doctor`` (also ``python -m``).
PROGRAMS = ['train', 'demo', 'launch', 'doctor']
WHERE = {name: 'gluon_multigpu' if name == 'doctor' else 'gluon_multigpu.cli' for name in PROGRAMS}
#: The lab's programs: scripts/NAME.py only, starting ``lab.commands.MODULE``.
LAB_PROGRAMS = {'inflight': 'inflight', 'scaling': 'scaling', 'bandwidth': 'bandwidth',
                'bfloat16': 'bfloat16', 'balance': 'balance_study', 'benchmark': 'benchmark',
                'network': 'network', 'failover': 'failover'}
#: Every program's module.
MODULES = [f'{WHERE[name]}.{name}' for name in PROGRAMS] + \
    [f'lab.commands.{module}' for module in LAB_PROGRAMS.values()]
BIN = pathlib.Path(sys.executable).parent
#: The environment of a program run as a user runs it: without this process's engine settings.
ENV = {k: v for k, v in os.environ.items()
       if k not in ('MXNET_CPU_TEMP_COPY', 'OMP_NUM_THREADS', 'GLUON_MULTIGPU_ENGINE_ENV')}

#: Prints, when MXNet is first imported, the engine variables it loads with.
PROBE = '''import os, sys

class _Probe:
    def find_spec(self, name, path=None, target=None):
        if name == 'mxnet':
            sys.meta_path.remove(self)
            print('mxnet loads with', os.environ.get('OMP_NUM_THREADS'),
                  os.environ.get('MXNET_CPU_TEMP_COPY'), file=sys.stderr, flush=True)
        return None

sys.meta_path.insert(0, _Probe())
'''


def console_script(name):
    path = BIN / f'gluon-multigpu-{name}'
    if not path.is_file():
        pytest.fail(f'{path} is missing: install the package with its entry points '
                    "(pip install -e '.[test]')")
    return str(path)


def test_setup_cfg_installs_every_program_and_each_launcher_starts_its_own():
    text = (REPO / 'setup.cfg').read_text()
    assert re.findall(r'gluon-multigpu-(\w+) = ([\w.]+)\.(\w+):start', text) == \
        [(name, WHERE[name], name) for name in PROGRAMS]
    assert sorted(p.stem for p in (REPO / 'scripts').glob('[a-z]*.py')) == \
        sorted(PROGRAMS + list(LAB_PROGRAMS))
    for name in PROGRAMS:
        launcher = (REPO / 'scripts' / f'{name}.py').read_text()
        assert f'from {WHERE[name]} import {name}\n' in launcher
        assert launcher.rstrip().endswith(f'{name}.start(__file__)')
        assert callable(importlib.import_module(f'{WHERE[name]}.{name}').start)
    for name, module in LAB_PROGRAMS.items():
        launcher = (REPO / 'scripts' / f'{name}.py').read_text()
        assert f'from lab.commands import {module}  #' in launcher
        assert launcher.rstrip().endswith(f'{module}.start(__file__)')
        assert callable(importlib.import_module(f'lab.commands.{module}').start)


@pytest.mark.parametrize('module', MODULES + ['lab.commands.common',
                                              'lab.commands.bench_workers'])
def test_no_program_loads_mxnet_when_imported(module):
    # it must set the engine first, from its flags: the package loads MXNet when a name needs it;
    # nor NumPy: a NumPy that cannot load is then one line of the program's (console.start)
    proc = run_bounded([sys.executable, '-c', f'import sys, {module}; print(sorted(m for m in '
                        "('mxnet', 'matplotlib', 'numpy') if m in sys.modules))"],
                       timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ['[]'], proc.stderr


@pytest.mark.parametrize('module', MODULES)
def test_no_parser_takes_abbreviations(module):
    program = importlib.import_module(module)
    assert program.build_parser().allow_abbrev is False


@pytest.mark.slow
@pytest.mark.parametrize('how', ['console script', 'scripts/train.py'])
@pytest.mark.parametrize('flags, threads, copies', [
    (['--cpu-devices', '2'], None, '1'),  # scratch copies: one a thread (engine.recommended)
    (['--cpu-devices', '1', '--sync-bn'], 'all', '256')])
def test_the_engine_is_set_from_the_device_flags_before_mxnet_loads(tmp_path, how, flags,
                                                                    threads, copies):
    (tmp_path / 'sitecustomize.py').write_text(PROBE)
    program = ([console_script('train')] if how == 'console script' else
               [sys.executable, str(REPO / 'scripts' / 'train.py')])
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get('PYTHONPATH', '')]))
    proc = run_bounded([*program, *flags, '--help'], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ''  # the help is made from the configuration: no MXNet loaded
    assert proc.stdout.startswith('usage: ' + ('gluon-multigpu-train' if how == 'console script'
                                               else 'train.py'))
    proc = run_bounded([*program, *flags, '--synthetic', '--model', 'simple-cnn', '--num-train',
                        '64', '--num-test', '32', '--batch-size', '32', '--num-epochs', '1',
                        '--progress-interval', '0'], env=env, timeout=180, cwd=tmp_path)
    # (--sync-bn with the simple CNN is refused, once MXNet has loaded: the line comes first)
    assert proc.returncode == (2 if '--sync-bn' in flags else 0), proc.stderr
    cores = engine.cores()
    per_context = str(cores if threads == 'all' else max(1, cores // 2))
    assert proc.stderr.splitlines()[:1] == [f'mxnet loads with {per_context} {copies}']


@pytest.mark.slow
def test_the_console_script_trains_as_scripts_train_does(fashion_dir, tmp_path):
    argv = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1', '--num-train',
            '256', '--num-test', '64', '--batch-size', '64', '--data-dir', str(fashion_dir),
            '--progress-interval', '0']
    runs = [run_bounded([*program, *argv], env=ENV, cwd=tmp_path, timeout=300)
            for program in ([console_script('train')],
                            [sys.executable, str(REPO / 'scripts' / 'train.py')])]
    for proc in runs:
        assert proc.returncode == 0 and proc.stderr == '', proc.stderr
    lines = [re.sub(r'\d+\.\d s|\d+ samples/s|\d+\.\d sec/epoch', 'T', p.stdout) for p in runs]
    assert lines[0] == lines[1] and lines[0].startswith('training simple-cnn on fashion-mnist')


@pytest.mark.slow
@pytest.mark.parametrize('argv, status, begins, says', [
    (['--cpu-devices', '2', '--num-epochs', '0'], 2, 'gluon-multigpu-train: error: ',
     ['--num-epochs: 0 is not positive', '(see --help)']),
    (['--cpu-devices', '3', '--batch-size', '2'], 2, 'error: ',
     ['a batch of 2 ', '3 devices', 'use --batch-size 3 or more']),
    (['--cpu-devices', '1', '--kvstore', 'dist_sync'], 2, 'error: --kvstore dist_sync ',
     ['DMLC_ROLE, DMLC_PS_ROOT_URI', 'start it with: gluon-multigpu-launch -n WORKERS -s SERVERS '
      '-- gluon-multigpu-train --kvstore dist_sync ...']),
])
def test_the_console_script_exits_with_the_programs_status_and_names_itself(argv, status, begins,
                                                                            says, tmp_path):
    """One line naming the flag and the console programs; the wording: tests/training/test_messages.py."""
    env = {k: v for k, v in ENV.items() if not k.startswith('DMLC_')}
    proc = run_bounded([console_script('train'), *argv], env=env, cwd=tmp_path, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr.count('\n')) == (status, '', 1), proc.stderr
    assert proc.stderr.startswith(begins) and 'python' not in proc.stderr, proc.stderr
    assert all(part in proc.stderr for part in says), proc.stderr


@pytest.mark.slow
def test_the_launchers_console_script_names_the_console_programs(tmp_path):
    proc = run_bounded([console_script('launch'), '-n', '1', '--'], env=ENV, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
    assert proc.stderr.startswith('error: no command to run: ') and \
        '-- gluon-multigpu-train --kvstore dist_sync' in proc.stderr and \
        'scripts/' not in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize('name', PROGRAMS)
def test_each_console_script_is_its_scripts_program(name):
    scripted = run_bounded([sys.executable, str(REPO / 'scripts' / f'{name}.py'), '--help'],
                           env=ENV, timeout=120)
    installed = run_bounded([console_script(name), '--help'], env=ENV, timeout=120)
    assert scripted.returncode == installed.returncode == 0, (scripted.stderr, installed.stderr)
    # past the usage block, which argparse wraps by the length of the program's name
    scripted, installed = (p.stdout.split('\n\n', 1)[1] for p in (scripted, installed))
    assert scripted.replace(f'{name}.py', f'gluon-multigpu-{name}') == installed


def test_a_resumed_run_is_started_as_the_interrupted_one_was(monkeypatch, tmp_path):
    train = importlib.import_module('gluon_multigpu.cli.train')
    monkeypatch.delitem(console._STARTED, 'folder', raising=False)  # pylint: disable=W0212
    console.started()  # the console script
    assert train.resume_command(['--cpu-devices', '2']) == \
        'gluon-multigpu-train --cpu-devices 2 --resume'
    assert console.program('launch') == 'gluon-multigpu-launch'
    console.started(str(REPO / 'scripts' / 'train.py'))
    monkeypatch.chdir(REPO)
    assert train.resume_command(['--resume', 'a b']) == "python scripts/train.py --resume 'a b'"
    assert console.program('launch') == 'python scripts/launch.py'
    monkeypatch.chdir(tmp_path)  # outside the checkout: the script's whole path
    assert train.resume_command([]) == f"python {REPO / 'scripts' / 'train.py'} --resume"

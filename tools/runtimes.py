"""The package on each Python and NumPy it supports: installed as a user would, checked, and trained.

A maintainer's tool (CI runs it after the README's suite: ``.ci/run``). For
each runtime it makes a fresh virtual environment with that runtime's Python,
installs the checkout with the README's command for it (``pip install -e
'.[test]'``; on NumPy 2 the README's NumPy 2 line, MXNet beside it with
``--no-deps``), then:

1. runs what differs between runtimes (``CHECKS``, one pytest run): the
   package and MXNet imported, the compatibility layer and the doctor, the
   operator cache (functions compiled by this Python), a checkpoint killed
   and resumed and the optimizer's state file, the launcher's two workers
   (their parameter server loads MXNet in processes of its own), the notebook
   in a real kernel of this Python. The rest of the suite runs the same code
   on every runtime: the README's suite runs it once;
2. runs the main job (the README's first command, with ``--json``) and
   compares its epoch figures (loss, training and test accuracy) with those
   of the reference runtime, NumPy 1.23 (what the package required before):
   each within a relative 1e-5; the reference's must have learned
   (``LEARNED``).

Each runtime's install runs while the runtime before it is checked and
trained (pip uses about one core of two, and waits on the disk).

``--suite-venv`` (CI): the virtual environment this tool runs in is a fresh
install by the README's line in which the README's whole suite has just
passed; the runtime it is (its Python, the README's line, no pin) is neither
made again nor checked again: only its main job runs, there. The other
runtimes on its Python pass over the checks that depend on the Python alone
(``PYTHON_ONLY``: the operator cache, the notebook's kernel).

A runtime whose Python is not on the machine is reported in one line and
passed over. The results (each runtime's versions, what ran and its seconds,
the figures, the largest relative difference; the run's wall time) go to ``--json``
(``docs/results/runtimes.json``, stamped with the machine and date). Exit
status 0 when every runtime that could be made passed, 1 otherwise, 2 for
bad flags.

    python tools/runtimes.py --work /tmp/runtimes --json docs/results/runtimes.json
    python tools/runtimes.py --work /tmp/runtimes --only numpy-2 python-3.13
"""
import argparse
import concurrent.futures
import configparser
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package (its ground floor only)
    sys.path.insert(0, ROOT)

from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402

#: The README's install command, and its NumPy 2 line (tests/docs/test_runtimes.py ties both to the
#: README's text). ``{extras}`` is where the test extra goes.
README_INSTALL = "pip install -e '.{extras}'"
NUMPY2_INSTALL = ("pip install 'numpy>=2' matplotlib requests && "
                  "pip install --no-deps mxnet==1.9.1 -e '.{extras}'")

#: name, Python (major.minor), install (README_INSTALL or NUMPY2_INSTALL), extra requirements.
#: The first is the reference: the NumPy the package required before (<1.24).
RUNTIMES = (
    ('numpy-1.23', '3.11', README_INSTALL, ['numpy==1.23.5']),
    ('numpy-1.26', '3.11', README_INSTALL, []),
    ('numpy-2', '3.11', NUMPY2_INSTALL, []),
    ('python-3.12', '3.12', README_INSTALL, []),
    ('python-3.13', '3.13', NUMPY2_INSTALL, []),
)

#: What each runtime runs of the suite: what differs between runtimes. The rest runs the same
#: code on every runtime: the README's suite runs it once (each runtime ran the whole fast loop
#: again before, 968 tests, about 125 s each on two cores).
CHECKS = (
    # MXNet on this NumPy and Python: the names restored, distutils, NumPy scalars made plain
    # for the operators, MXNet imported directly after the package (the one public line:
    # examples/plain_mxnet.py, MXNet's own Gluon Trainer, kvstores and split_and_load through
    # it); the doctor's two-context step; a NumPy or MXNet that cannot load, one line
    'tests/training/test_compat.py',
    # MXNet's operator functions compiled by this Python and kept per MXNet library and Python
    'tests/training/test_opcache.py',
    # importing the package loads no MXNet; every public name imports
    'tests/training/test_engine.py::test_importing_the_package_loads_neither_mxnet_nor_matplotlib',
    'tests/training/test_engine.py::test_every_public_name_can_be_imported_and_is_listed',
    # a checkpoint round trip through a SIGKILL; the optimizer's state file (pickled by MXNet)
    'tests/training/test_checkpoint.py::test_sigkill_in_the_middle_of_an_epoch_then_resume_matches',
    'tests/training/test_checkpoint.py::test_the_optimizer_state_file_continues_training_exactly',
    # the launcher's two workers: the parameter server unpickles the optimizer in its own
    # process, where MXNet loads as the server role
    'tests/launch/test_distributed.py::test_two_workers_equal_one_process_on_their_devices'
    '[dist_sync]',
    # the notebook in a real kernel of this Python (ipykernel, nbclient)
    'tests/docs/test_notebook.py::test_the_notebook_runs_end_to_end_in_a_real_kernel',
)
#: The checks whose outcome depends on the Python alone, not on NumPy: the operator cache (code
#: that Python compiles and marshals) and the notebook's kernel. With ``--suite-venv`` a runtime
#: on the suite venv's Python passes them over: the README's suite has just run them there.
PYTHON_ONLY = ('tests/training/test_opcache.py',
               'tests/docs/test_notebook.py::test_the_notebook_runs_end_to_end_in_a_real_kernel')

#: The main job, as the README's first command runs it (the data folder beside the checkout).
MAIN_JOB = ['scripts/train.py', '--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs',
            '2', '--data-dir']
#: The figures of each epoch compared with the reference's, and the largest relative difference.
FIGURES = ('train_loss', 'train_acc', 'test_acc')
TOLERANCE = 1e-5
#: The reference's main job must have learned: its last test accuracy at least this (chance is
#: 0.10; the README's run 0.85). Every other runtime's equals it.
LEARNED = 0.75


def say(line):
    print(line, flush=True)


def find_python(version):
    """A Python ``version`` (``'3.12'``) interpreter on this machine that can make a venv, or None:
    on PATH as ``python3.12``, or one of pyenv's builds; for the running Python's own version,
    the running interpreter's base."""
    if version == '%d.%d' % sys.version_info[:2]:
        candidates = [getattr(sys, '_base_executable', None) or sys.executable]
    else:
        candidates = []
    candidates += [shutil.which(f'python{version}'), f'/usr/bin/python{version}',
                   f'/usr/local/bin/python{version}']
    home = os.path.expanduser('~')
    candidates += sorted(glob.glob(os.path.join(os.environ.get('PYENV_ROOT', home + '/.pyenv'),
                                                'versions', f'{version}.*', 'bin',
                                                f'python{version}')), reverse=True)
    for path in candidates:
        if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        probe = subprocess.run([path, '-c', 'import sys, venv, ensurepip; '
                                'print("%d.%d" % sys.version_info[:2])'],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return path
    return None


def test_extra():
    """The requirements of the package's ``test`` extra (setup.cfg)."""
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, 'setup.cfg'))
    return [line.strip() for line in config['options.extras_require']['test'].splitlines()
            if line.strip() and not line.strip().startswith('#')]


def shell(command, venv, log, timeout):
    """Run ``command`` (a shell line) in the checkout with ``venv`` active; output to ``log``."""
    env = {k: v for k, v in os.environ.items() if k not in ('VIRTUAL_ENV', 'PYTHONPATH',
                                                            'PYTHONHOME')}
    env['PATH'] = os.path.join(venv, 'bin') + os.pathsep + env.get('PATH', '')
    env['VIRTUAL_ENV'] = venv
    with open(log, 'a', encoding='utf-8') as out:
        out.write(f'$ {command}\n')
        out.flush()
        try:
            done = subprocess.run(['bash', '-c', command], cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            out.write(f'\n(killed after {timeout} s)\n')
            return 124
    return done.returncode


def tail(log, lines=15):
    with open(log, encoding='utf-8', errors='replace') as f:
        return ''.join(f.readlines()[-lines:])


def pytest_counts(log_text):
    """{'passed': N, 'failed': N, ...} from pytest's closing line in ``log_text``."""
    closing = [line for line in log_text.splitlines() if re.search(r'\d+ (passed|failed)', line)]
    if not closing:
        return {}
    return {word: int(n) for n, word in re.findall(r'(\d+) (\w+)', closing[-1])}


def versions(venv):
    """Python, NumPy and MXNet versions of ``venv`` (MXNet's from its metadata: nothing loads)."""
    code = ('import json, platform, importlib.metadata as m, numpy; '
            'print(json.dumps({"python": platform.python_version(), "numpy": numpy.__version__, '
            '"mxnet": m.version("mxnet")}))')
    done = subprocess.run([os.path.join(venv, 'bin', 'python'), '-c', code], capture_output=True,
                          text=True, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {'error': done.stderr[-500:]}


def run_checks(venv, log, passed_over=()):
    """Run ``CHECKS`` but ``passed_over`` in ``venv``; their record: pytest's counts, status,
    seconds (and what was passed over)."""
    began = time.perf_counter()
    # -n 0: in one process (as fast as setup.cfg's four workers for these, with less CPU)
    status = shell('python -m pytest -q -p no:cacheprovider -n 0 ' + ' '.join(
        f"'{check}'" for check in CHECKS if check not in passed_over), venv, log, 1800)
    return dict(pytest_counts(tail(log, 5)), status=status,
                seconds=round(time.perf_counter() - began, 1),
                **({'passed_over': list(passed_over)} if passed_over else {}))


def main_job(record, name, venv, work, log, data_dir):
    """Run the main job in ``venv``; its epochs' figures (and seconds) into ``record``."""
    out = os.path.join(work, f'{name}-main-job.json')
    if os.path.exists(out):
        os.remove(out)
    began = time.perf_counter()
    status = shell(' '.join(['python'] + MAIN_JOB + [data_dir, '--json', out]), venv, log, 1200)
    record['main_job_seconds'] = round(time.perf_counter() - began, 1)
    if status:
        record.update(ok=False, failure=(record.get('failure', '') +
                                         f' main job status {status}').strip())
        return
    with open(out, encoding='utf-8') as f:
        epochs = json.load(f)['runs'][0]['epochs']
    record['epochs'] = [{k: e[k] for k in ('epoch',) + FIGURES} for e in epochs]


def install_runtime(name, python, install, extra, work):
    """Make runtime ``name``'s venv and install the checkout in it; return its record (``ok``
    False if the install failed)."""
    venv = os.path.join(work, name)
    log = os.path.join(work, f'{name}.log')
    shutil.rmtree(venv, ignore_errors=True)
    if os.path.exists(log):
        os.remove(log)
    record = {'name': name, 'install': install.format(extras='[test]'), 'log': log,
              'venv': venv}
    began = time.perf_counter()
    status = shell(f'{python} -m venv {venv}', venv, log, 300)
    if install is NUMPY2_INSTALL:
        # The NumPy 2 line installs the package --no-deps: the test extra's requirements by name.
        command = install.format(extras='') + ' && pip install ' + ' '.join(
            f"'{r}'" for r in test_extra())
    else:
        command = install.format(extras='[test]')
    if extra:
        command += ' ' + ' '.join(f"'{r}'" for r in extra)
    status = status or shell(command, venv, log, 1200)
    record['install_seconds'] = round(time.perf_counter() - began, 1)
    if status:
        record.update(ok=False, failure=f'install failed (status {status})',
                      seconds=record['install_seconds'])
    else:
        record['versions'] = versions(venv)
    return record


def check_and_train(record, work, data_dir, tests=True, passed_over=()):
    """Run the checks (``tests``; not ``passed_over``) and the main job in the installed runtime
    of ``record``; return the record, completed."""
    venv, log = record['venv'], record['log']
    began = time.perf_counter()
    if tests:
        record['checks'] = run_checks(venv, log, passed_over)
        if record['checks']['status']:
            record.update(ok=False, failure='checks failed')
    main_job(record, record['name'], venv, work, log, data_dir)
    record['seconds'] = round(record['install_seconds'] + time.perf_counter() - began, 1)
    record.setdefault('ok', True)
    return record


def suite_runtime(venv):
    """The runtime (its ``RUNTIMES`` row) that ``venv``, the README's install of the running
    Python, is: the same Python, the README's line, no pin; None if none is."""
    here = versions(venv)
    for row in RUNTIMES:
        name, version, install, extra = row
        if (install is README_INSTALL and not extra and here.get('python', '').rsplit('.', 1)[0]
                == version and here.get('numpy', '').startswith('1.')):
            return row
    return None


def run_in_suite_venv(name, venv, work, data_dir):
    """Runtime ``name`` as the venv this tool runs in, where the README's suite passed: its
    main job only; return its record."""
    log = os.path.join(work, f'{name}.log')
    if os.path.exists(log):
        os.remove(log)
    record = {'name': name, 'install': README_INSTALL.format(extras='[test]'), 'log': log,
              'suite_venv': True, 'versions': versions(venv),
              'tested_by': "the README's suite (python -m pytest -q), which passed in this venv"}
    began = time.perf_counter()
    main_job(record, name, venv, work, log, data_dir)
    record['seconds'] = round(time.perf_counter() - began, 1)
    record.setdefault('ok', True)
    return record


def largest_difference(epochs, reference):
    """The largest relative difference between two runs' figures (inf if their epochs differ)."""
    if len(epochs) != len(reference):
        return float('inf')
    worst = 0.0
    for mine, theirs in zip(epochs, reference):
        for key in FIGURES:
            a, b = mine[key], theirs[key]
            worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
    return worst


def compare(records):
    """Mark each record's main-job figures against the first (the reference), which must have
    learned (``LEARNED``); in place."""
    reference = records[0].get('epochs') if records else None
    if reference:
        records[0]['learned'] = reference[-1]['test_acc'] >= LEARNED
        if not records[0]['learned'] and records[0].get('ok', True):
            records[0].update(ok=False, failure=(
                records[0].get('failure', '') + f" the reference's main job did not learn (test "
                f"accuracy {reference[-1]['test_acc']:.3f} < {LEARNED})").strip())
    for record in records:
        if 'epochs' not in record or reference is None:
            continue
        record['largest_relative_difference'] = largest_difference(record['epochs'], reference)
        record['equal_to_reference'] = record['largest_relative_difference'] <= TOLERANCE
        if not record['equal_to_reference']:
            record.update(ok=False, failure=(record.get('failure', '') + ' main job figures '
                                             'differ from the reference').strip())


def summary(record):
    """One line for a runtime's record."""
    if record.get('absent'):
        return f"{record['name']}: no Python {record['python_wanted']} on this machine: passed over"
    v = record.get('versions', {})
    parts = [f"{record['name']}: Python {v.get('python', '?')}, NumPy {v.get('numpy', '?')}, "
             f"MXNet {v.get('mxnet', '?')}"]
    if record.get('suite_venv'):
        parts.append("this venv, where the README's suite passed: its main job only")
    elif isinstance(record.get('checks'), dict):
        counts = record['checks']
        parts.append(f"checks {counts.get('passed', 0)} passed, {counts.get('failed', 0)} "
                     f"failed in {counts['seconds']:.0f} s" + (
                         f" ({len(counts['passed_over'])} of the suite's Python passed over)"
                         if counts.get('passed_over') else ''))
    if 'largest_relative_difference' in record:
        parts.append(f"main job {'equal to' if record['equal_to_reference'] else 'NOT equal to'} "
                     f"the reference's (largest relative difference "
                     f"{record['largest_relative_difference']:.1e})")
    if 'seconds' in record:
        parts.append(f"{record['seconds']:.0f} s in all")
    if not record.get('ok', False):
        parts.append(f"FAILED: {record.get('failure', '?')} (log: {record.get('log')})")
    return '; '.join(parts)


def main(argv=None):
    names = [r[0] for r in RUNTIMES]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--work', required=True, help='folder for the virtual environments and logs')
    p.add_argument('--json', help='write the results here (docs/results/runtimes.json)')
    p.add_argument('--only', nargs='+', choices=names, metavar='NAME',
                   help=f'these runtimes only ({", ".join(names)}); the reference always runs')
    p.add_argument('--no-tests', action='store_true', help='install and train only')
    p.add_argument('--suite-venv', action='store_true',
                   help="this tool runs in a fresh venv of the README's install where the README's "
                        'suite has just passed (CI): the runtime it is runs its main job there only')
    p.add_argument('--data-dir', default=os.path.join(os.path.dirname(ROOT), 'shared', 'data',
                                                      'fashion-mnist'))
    args = p.parse_args(argv)
    if not os.path.isdir(args.data_dir):
        p.exit(2, f'runtimes.py: error: no data folder {args.data_dir}: give --data-dir\n')
    os.makedirs(args.work, exist_ok=True)
    here = None
    if args.suite_venv:
        if sys.prefix == sys.base_prefix:
            p.exit(2, 'runtimes.py: error: --suite-venv: this Python is not in a virtual '
                      'environment\n')
        here = suite_runtime(sys.prefix)
        say(f"--suite-venv: this venv is {here[0]}: its main job only" if here else
            '--suite-venv: this venv is none of the runtimes: each is made afresh')
    work, data_dir = os.path.abspath(args.work), os.path.abspath(args.data_dir)
    chosen = [(name, version, install, extra, find_python(version))
              for index, (name, version, install, extra) in enumerate(RUNTIMES)
              if not args.only or name in args.only or index == 0]
    began = time.perf_counter()
    records = []
    # Each install (pip: mostly one core, and waits) runs while the runtime before it is checked
    # and trained, one install at a time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as installer:
        installs = {}

        def install_next(after):
            for name, version, install, extra, python in chosen[after + 1:]:
                if python is not None and not (here and name == here[0]):
                    say(f'{name}: Python {version} ({python}), installing...')
                    installs[name] = installer.submit(install_runtime, name, python, install,
                                                      extra, work)
                    return
        install_next(-1)
        for index, (name, version, install, extra, python) in enumerate(chosen):
            if here is not None and name == here[0]:
                say(f'{name}: this venv ({sys.prefix}), where the README\'s suite passed')
                record = run_in_suite_venv(name, sys.prefix, work, data_dir)
            elif python is None:
                record = {'name': name, 'absent': True, 'python_wanted': version, 'ok': True}
            else:
                record = installs[name].result()
                install_next(index)
                if record.get('ok', True):
                    same_python = here is not None and version == here[1]
                    record = check_and_train(record, work, data_dir, tests=not args.no_tests,
                                             passed_over=PYTHON_ONLY if same_python else ())
            records.append(record)
            compare(records)
            say(summary(record))
            if not record.get('ok') and record.get('log'):
                say(f"--- the end of {record['log']}:\n{tail(record['log'], 40)}---")
    seconds = round(time.perf_counter() - began, 1)
    if args.json:
        kept = [{k: v for k, v in r.items() if k not in ('log', 'venv')} for r in records]
        with atomic_write(args.json) as f:
            f.write(json.dumps({'runtimes': kept, 'only': args.only, 'checks': list(CHECKS),
                                'tolerance': TOLERANCE, 'learned': LEARNED,
                                'reference': RUNTIMES[0][0], 'seconds': seconds, **stamp()},
                               indent=2) + '\n')
    failed = [r['name'] for r in records if not r.get('ok')]
    say(f"runtimes: {len(records) - len(failed)} of {len(records)} passed"
        + (f"; failed: {', '.join(failed)}" if failed else ''))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

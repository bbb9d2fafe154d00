"""The package on each Python and NumPy it supports: installed as a user would, tested, and trained.

A maintainer's tool (CI runs it after the README's suite: ``.ci/run``). For
each runtime it makes a fresh virtual environment with that runtime's Python,
installs the checkout with the README's command for it (``pip install -e
'.[test]'``; on NumPy 2 the README's NumPy 2 line, MXNet beside it with
``--no-deps``), then:

1. runs the tests: the fast loop (``-m "not slow and not soak"``, but the
   tests that read the results this tool writes: ``OWN_RESULTS``), then the
   named slow tests of ``SLOW`` (the main job's network learning the real
   data, a checkpoint killed and resumed, the launcher's two workers, the
   notebook in a real kernel);
2. runs the main job (the README's first command, with ``--json``) and
   compares its epoch figures (loss, training and test accuracy) with those
   of the reference runtime, NumPy 1.23 (what the package required before):
   each within a relative 1e-5.

A runtime whose Python is not on the machine is reported in one line and
passed over. The results (each runtime's versions, test counts, figures,
largest relative difference) go to ``--json`` (``docs/results/runtimes.json``,
stamped with the machine and date). Exit status 0 when every runtime that
could be made passed, 1 otherwise, 2 for bad flags.

    python tools/runtimes.py --work /tmp/runtimes --json docs/results/runtimes.json
    python tools/runtimes.py --work /tmp/runtimes --only numpy-2 python-3.13
"""
import argparse
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

from gluon_multigpu.base.atomic import atomic_write  # noqa: E402
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

#: The slow tests run beside the fast loop: the main job's network on the real data, a checkpoint
#: round trip through a SIGKILL, the launcher's two workers, the notebook in a real kernel.
SLOW = (
    'tests/training/test_real_training.py::test_simple_cnn_on_two_cpu_contexts_learns_fashion_mnist',
    'tests/training/test_checkpoint.py::test_sigkill_in_the_middle_of_an_epoch_then_resume_matches',
    'tests/launch/test_distributed.py::test_two_workers_equal_one_process_on_their_devices',
    'tests/docs/test_notebook.py::test_the_notebook_runs_end_to_end_in_a_real_kernel',
)

#: The tests that read what this tool writes: not run by it (the README's suite runs them).
OWN_RESULTS = ('tests/docs/test_runtimes.py', 'tests/docs/test_doc_figures.py')

#: The main job, as the README's first command runs it (the data folder beside the checkout).
MAIN_JOB = ['scripts/train.py', '--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs',
            '2', '--data-dir']
#: The figures of each epoch compared with the reference's, and the largest relative difference.
FIGURES = ('train_loss', 'train_acc', 'test_acc')
TOLERANCE = 1e-5


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


def run_runtime(name, python, install, extra, work, data_dir, tests=True):
    """Make, install, test and train runtime ``name``; return its record."""
    venv = os.path.join(work, name)
    log = os.path.join(work, f'{name}.log')
    shutil.rmtree(venv, ignore_errors=True)
    if os.path.exists(log):
        os.remove(log)
    record = {'name': name, 'install': install.format(extras='[test]'), 'log': log}
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
        record.update(ok=False, failure=f'install failed (status {status})')
        return record
    record['versions'] = versions(venv)
    if tests:
        began = time.perf_counter()
        # What reads this tool's own results (tests/docs/test_runtimes.py, and the docs' figures of
        # tests/docs/test_doc_figures.py, the README's among them) is the README suite's to run:
        # here it would read them before they exist. The rest of the fast loop runs.
        fast = shell('python -m pytest -q -p no:cacheprovider -m "not slow and not soak" '
                     + ' '.join(f'--ignore={path}' for path in OWN_RESULTS), venv, log, 1800)
        record['fast_loop'] = dict(pytest_counts(tail(log, 5)), status=fast,
                                   seconds=round(time.perf_counter() - began, 1))
        began = time.perf_counter()
        slow = shell('python -m pytest -q -p no:cacheprovider ' + ' '.join(SLOW), venv, log, 1800)
        record['slow_subset'] = dict(pytest_counts(tail(log, 5)), status=slow,
                                     seconds=round(time.perf_counter() - began, 1))
        if fast or slow:
            record.update(ok=False, failure='tests failed')
    out = os.path.join(work, f'{name}-main-job.json')
    if os.path.exists(out):
        os.remove(out)
    began = time.perf_counter()
    status = shell(' '.join(['python'] + MAIN_JOB + [data_dir, '--json', out]), venv, log, 1200)
    record['main_job_seconds'] = round(time.perf_counter() - began, 1)
    if status:
        record.update(ok=False, failure=record.get('failure', '') + f' main job status {status}')
        return record
    with open(out, encoding='utf-8') as f:
        epochs = json.load(f)['runs'][0]['epochs']
    record['epochs'] = [{k: e[k] for k in ('epoch',) + FIGURES} for e in epochs]
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
    """Mark each record's main-job figures against the first (the reference); in place."""
    reference = records[0].get('epochs') if records else None
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
    for key, words in (('fast_loop', 'fast loop'), ('slow_subset', 'slow subset')):
        if key in record:
            counts = record[key]
            parts.append(f"{words} {counts.get('passed', 0)} passed, {counts.get('failed', 0)} "
                         f"failed in {counts['seconds']:.0f} s")
    if 'largest_relative_difference' in record:
        parts.append(f"main job {'equal to' if record['equal_to_reference'] else 'NOT equal to'} "
                     f"the reference's (largest relative difference "
                     f"{record['largest_relative_difference']:.1e})")
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
    p.add_argument('--data-dir', default=os.path.join(os.path.dirname(ROOT), 'shared', 'data',
                                                      'fashion-mnist'))
    args = p.parse_args(argv)
    if not os.path.isdir(args.data_dir):
        p.exit(2, f'runtimes.py: error: no data folder {args.data_dir}: give --data-dir\n')
    os.makedirs(args.work, exist_ok=True)
    records = []
    for index, (name, version, install, extra) in enumerate(RUNTIMES):
        if args.only and name not in args.only and index != 0:
            continue
        python = find_python(version)
        if python is None:
            record = {'name': name, 'absent': True, 'python_wanted': version, 'ok': True}
        else:
            say(f'{name}: Python {version} ({python}), installing...')
            record = run_runtime(name, python, install, extra, os.path.abspath(args.work),
                                 os.path.abspath(args.data_dir), tests=not args.no_tests)
        records.append(record)
        compare(records)
        say(summary(record))
        if not record.get('ok') and record.get('log'):
            say(f"--- the end of {record['log']}:\n{tail(record['log'], 40)}---")
    if args.json:
        kept = [{k: v for k, v in r.items() if k != 'log'} for r in records]
        with atomic_write(args.json) as f:
            f.write(json.dumps({'runtimes': kept, 'tolerance': TOLERANCE,
                                'reference': RUNTIMES[0][0], **stamp()}, indent=2) + '\n')
    failed = [r['name'] for r in records if not r.get('ok')]
    say(f"runtimes: {len(records) - len(failed)} of {len(records)} passed"
        + (f"; failed: {', '.join(failed)}" if failed else ''))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

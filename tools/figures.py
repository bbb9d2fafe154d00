"""The measured figures of the docs, checked against (or filled from) the results files.

A maintainer's tool, not part of the package. Every measured figure in
README.md and docs/*.md (a duration, a speed, a memory size, an estimate, an
accuracy of a run) is either tied to the results file it comes from by a
marker that renders as nothing::

    <!-- figure kvstore-simple-cnn/runs.json runs/0/epochs/0/seconds .1f -->26.5<!-- /figure -->

or it is an error. The marker names a file under docs/results/, a key and a
format:

- the key is a path of ``/``-separated steps: a dict key, a list index, or
  ``col=value,col=value`` (the one row of a list, a CSV's rows, whose
  columns have those values); a CSV field of numbers joined by ``/``
  (``0.0355/0.0005``) is a list;
- ``KEY//KEY`` is a ratio: the first value divided by the second;
- the format is a Python format spec (``.1f``, ``,.0f``, ``.0%``), or
  ``min-s`` (seconds as ``12 min 25 s``), ``yes-no`` (a boolean), optionally after a scale:
  ``/60:.0f`` divides by 60 first, ``*100:.0f`` multiplies, ``-1:.0%``
  subtracts 1 (a ratio as "4% longer").

Every results file a marker names must say on which machine and on which
date it was measured (``machine`` and ``date``: keys of a JSON file, columns
of a CSV file; the writers of the package add them, see
``gluon_multigpu/base/machine.py``).

    python tools/figures.py --check    # exit 1 and one line per problem, file:line first
    python tools/figures.py --write    # fill every marked figure from its file, then check
    python tools/figures.py --suite-time   # run the suite, record docs/results/suite-time.json, --write

A number with a unit outside code, markers and the allow-list ``ALLOWED``
(figures that are not measurements here: the book's, flag defaults, sizes)
is reported as unmarked.
"""
import argparse
import csv
import glob
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package (its ground floor only)
    sys.path.insert(0, ROOT)

from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402

__all__ = ['check', 'write', 'main', 'MARKER', 'ALLOWED', 'PENDING', 'UNCHECKED']

RESULTS = os.path.join('docs', 'results')
DOCS = ['README.md', 'docs/*.md']

MARKER = re.compile(r'<!-- figure (\S+) (\S+) (\S+) -->(.*?)<!-- /figure -->', re.S)
UNIT = (r'(?:s|sec|secs|seconds?|ms|min|minutes?|h|hours?|days?|GB|MB|GiB|MiB|KB|kB|KiB|'
        r'images/s|samples/s|img/s|%|x|times)')
NUMBER = r'(?<![\w.,/-])\d[\d,]*(?:\.\d+)?'
MEASURE = re.compile(NUMBER + r'(?:\s?(?:-|to)\s?\d[\d,]*(?:\.\d+)?)?\s?' + UNIT + r'(?![\w/])')

#: Figures in prose that are not measurements made here: (file, figure, why).
ALLOWED = (
    ('README.md', '13.4 s', "the book's printed time for one GPU"),
    ('README.md', '7.9 s', "the book's printed time for two GPUs"),
    ('README.md', '10 seconds', 'the progress interval, a flag default'),
    ('docs/guide.md', '10 seconds', 'the progress interval, a flag default'),
    ('docs/guide.md', '64 MiB', "a default of the guard's memory setting"),
    ('docs/guide.md', '1 MiB', "a default of the guard's memory setting"),
    ('docs/guide.md', '32 MiB', "the size limit of a checkpoint's manifest"),
    ('docs/guide.md', '0.1 x', "the learning-rate rule of ResNet-18's recipe"),
    ('docs/guide.md', '5%', "the gain at which --split auto moves: a setting"),
    ('docs/guide.md', '2 minutes', "the --sync-bn watchdog's limit: a setting"),
    ('docs/guide.md', '20 times', "the --sync-bn watchdog's limit: a setting"),
    ('docs/guide.md', '3%', "the kvstore comparison's noise threshold: a setting"),
    ('docs/guide.md', '6 MB', "the memory estimate's settings (MEMORY, section/model.py)"),
    ('docs/guide.md', '27 MB', "the memory estimate's settings (MEMORY, section/model.py)"),
    ('docs/guide.md', '0.32 MB', "the memory estimate's settings (MEMORY, section/model.py)"),
    ('docs/distributed.md', '2 s', "the agents' heartbeat (multihost.plan.HEARTBEAT)"),
    ('docs/distributed.md', '64 KiB', "the agent's longest line (multihost.agent.LINE_LIMIT)"),
    ('docs/distributed.md', '3 s', 'SIGTERM to SIGKILL (multihost.plan.TERM_WAIT)'),
    ('docs/distributed.md', '120 s', "settings: the join timeout's default, Slurm's "
                                     '--signal=B:USR1@120 and cred_expire default'),
    ('docs/distributed.md', '60 s', "--grace's default; the Slurm test's bound on a lost host"),
    ('docs/distributed.md', '15 s', "--timeout's default"),
    ('docs/distributed.md', '5 s', "the failover study's --timeout 5"),
    ('docs/distributed.md', '8 s', "the failover study's wait: --timeout + TERM_WAIT + 5"),
    ('docs/distributed.md', '0.1 s', "the failover study's progress interval: a setting"),
    ('docs/distributed.md', '10 s', "the test Slurm's cred_expire=10: a setting"),
    ('docs/distributed.md', '1-2 s', "the test Slurm's bf_interval=1, sched_interval=2"),
    ('docs/distributed.md', '2 x', 'a size: the Slurm runs\' batch of 2 x 64'),
    ('docs/distributed.md', '512 x', "a size: ResNet-18's largest convolution"),
    ('docs/distributed.md', '3 x', "a size: ResNet-18's largest convolution"),
    ('docs/distributed.md', '4,478 images/s', "the book's printed figure"),
    ('docs/distributed.md', '6 s', "the network study's timed epoch (TIMED_SECONDS): a setting"),
    ('docs/distributed.md', '50 ms', "the shaped links' tbf latency (netns.TBF_LATENCY)"),
    ('docs/distributed.md', '75%', "a size: the share of ResNet-18's parameters in its last "
                                   'stage'),
    ('docs/distributed.md', '79%', "a size: the share of the simple CNN's parameters in its "
                                   'first dense layer'),
    ('docs/exercises.md', '5%', "the gain at which --split auto moves: a setting"),
    ('docs/guide.md', '4 MiB', "glibc's mmap threshold the engine sets: a setting"),
    ('docs/guide.md', '256 MiB', "glibc's trim threshold the engine sets: a setting"),
    ('docs/results.md', '4 MiB', "glibc's mmap threshold the engine sets: a setting"),
    ('docs/results.md', '1 MiB', "the mmap threshold of a lever measured: a setting"),
    ('docs/results.md', '256 MiB', "glibc's trim threshold the engine sets: a setting"),
    ('docs/results.md', '128 KiB', "glibc's trim threshold by default: a setting"),
    ('docs/results.md', '1.2 times', "issue 29's memory aim: a target, not a measurement"),
    ('docs/exercises.md', '20 s', "the progress intervals of the seed-0 runs: settings"),
    ('docs/exercises.md', '10 s', "the progress interval of the run that ended: a setting"),
    ('docs/exercises.md', '2 minutes', "the --sync-bn watchdog's limit: a setting"),
    ('docs/exercises.md', '20 times', "the --sync-bn watchdog's limit: a setting"),
    ('docs/exercises.md', '120 s', "the --sync-bn watchdog's limit (2 minutes): a setting"),
    ('docs/exercises.md', '13.4 s', "the book's printed time for one GPU"),
    ('docs/exercises.md', '7.9 s', "the book's printed time for two GPUs"),
    ('docs/exercises.md', '1.7x', "the book's two times above, divided"),
    ('docs/exercises.md', '512 x', "the size of balance.py's matrix products: a setting"),
    ('docs/results.md', '3%', "the kvstore comparison's noise threshold: a setting"),
    ('docs/guide.md', '95%', "the confidence of the comparisons' intervals (study.paired): a "
                             'setting'),
    ('docs/design.md', '95%', "the confidence of the comparisons' intervals: a setting"),
    ('docs/design.md', '3%', "the comparisons' smallest difference named: a setting"),
    ('docs/results.md', '95%', "the confidence of the comparisons' intervals: a setting"),
    ('docs/exercises.md', '95%', "the confidence of the comparisons' intervals: a setting"),
    ('docs/results.md', '15 ms', "the known slowdown of issue 39's trial (a sleep): a setting"),
    ('docs/results.md', '28 x', 'a size: the profile\'s 28 x 28 images'),
    ('docs/results.md', '57 ms', "the book's 4,478 images/s as the time of a step of 256"),
    ('docs/results.md', '4,478 images/s', "the book's printed figure"),
)

#: Measured figures whose results files are not written yet: (file, figure, the file awaited).
PENDING = ()

#: Sections whose unmarked figures are not checked yet: (file, heading, why); the heading's
#: section runs to the next heading of its level or above. Their markers are checked.
UNCHECKED = ()


class FigureError(Exception):
    """A marker whose file, key or format cannot give a figure: one line."""


def load(path):
    """A results file: JSON as it is, CSV as a list of row dicts (numbers as numbers)."""
    with open(path) as f:
        if not path.endswith('.csv'):
            return json.load(f)
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text):
    """A CSV field as a number, a list of numbers (``0.0355/0.0005``), or as it is."""
    if text and '/' in text:
        parts = [_number(part) for part in text.split('/')]
        return parts if all(isinstance(p, (int, float)) for p in parts) else text
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            pass
    return text


def lookup(data, key):
    """The value at ``key`` (``a/0/b``, ``col=value,col=value`` picks the one matching row).

    ``KEY//KEY`` is the first value divided by the second (a ratio of two figures).
    """
    if '//' in key:
        top, bottom = key.split('//', 1)
        return lookup(data, top) / lookup(data, bottom)
    for step in key.split('/'):
        if '=' in step:
            wanted = dict(part.split('=', 1) for part in step.split(','))
            rows = [r for r in data if all(str(r.get(k)) == v for k, v in wanted.items())]
            if len(rows) != 1:
                raise FigureError(f'{len(rows)} rows have {step} (one must)')
            data = rows[0]
        elif isinstance(data, list):
            data = data[int(step)]
        elif isinstance(data, dict) and step in data:
            data = data[step]
        else:
            raise FigureError(f'no {step!r} in the file at {key}')
    return data


def render(value, spec):
    """``value`` as the docs write it: ``spec`` is ``[/N:|*N:|-N:]FORMAT`` (see the module)."""
    if spec[0] in '/*-':
        op, (scale, spec) = spec[0], spec[1:].split(':', 1)
        value = {'/': value / float(scale), '*': value * float(scale),
                 '-': value - float(scale)}[op]
    if spec == 'min-s':
        minutes, seconds = divmod(round(value), 60)
        return f'{minutes} min {seconds} s'
    if spec == 'yes-no':  # a boolean (an aim met or not)
        return 'yes' if value else 'no'
    try:
        return format(value, spec)
    except (TypeError, ValueError) as e:
        raise FigureError(f'{value!r} cannot be written as {spec!r}: {e}') from None


def provenance(data):
    """``(machine, date)`` of a loaded results file, or None for each it does not record."""
    first = data[0] if isinstance(data, list) and data else data
    if not isinstance(first, dict):
        return None, None
    return first.get('machine') or None, first.get('date') or None


def docs(root=ROOT):
    """The docs the figures are checked in, as paths relative to ``root``."""
    found = []
    for pattern in DOCS:
        found += sorted(glob.glob(os.path.join(root, pattern)))
    return [os.path.relpath(p, root) for p in found]


def figures(text, root=ROOT):
    """Each marker of ``text``: ``(match, figure it must show or None, problem or None)``."""
    cache = {}
    for m in MARKER.finditer(text):
        name, key, spec, _ = m.groups()
        path = os.path.join(root, RESULTS, name)
        try:
            if path not in cache:
                cache[path] = load(path)
            data = cache[path]
            machine, date = provenance(data)
            if not (machine and date):
                raise FigureError(f'{name} says not on which machine and date it was measured '
                                  f'(its "machine" and "date")')
            yield m, render(lookup(data, key), spec), None
        except (OSError, ValueError, FigureError, IndexError) as e:
            yield m, None, f'{name} {key}: {e}'


def line_of(text, offset):
    return text.count('\n', 0, offset) + 1


def prose(text):
    """``text`` with code blocks, inline code, markers and comments blanked (lines kept)."""
    blank = lambda m: re.sub(r'[^\n]', ' ', m.group(0))  # noqa: E731
    text = re.sub(r'^(```|~~~).*?^\1[^\n]*$', blank, text, flags=re.S | re.M)
    text = MARKER.sub(blank, text)
    text = re.sub(r'<!--.*?-->', blank, text, flags=re.S)
    text = re.sub(r'\]\([^)]*\)', blank, text)
    return re.sub(r'`[^`]*?`', blank, text)


def unchecked_lines(name, text):
    """The line numbers of ``text`` in its ``UNCHECKED`` sections."""
    lines = prose(text).split('\n')  # a '#' in a code block is no heading
    headings = [(i, len(line) - len(line.lstrip('#')), line.rstrip())
                for i, (line, clean) in enumerate(zip(text.split('\n'), lines), 1)
                if clean.startswith('#')]
    last, lines = len(lines) + 1, set()
    for doc, heading, _ in UNCHECKED:
        for k, (start, level, title) in enumerate(headings):
            if doc == name and title == heading:
                end = next((i for i, lv, _ in headings[k + 1:] if lv <= level), last)
                lines.update(range(start, end))
    return lines


def unmarked(name, text):
    """``(line, figure)`` of each number with a unit in ``text``'s prose that is not marked."""
    allowed = {figure for doc, figure, _ in ALLOWED + PENDING if doc == name}
    clean, skip = prose(text), unchecked_lines(name, text)
    hits = [(line_of(clean, m.start()), m.group(0)) for m in MEASURE.finditer(clean)
            if re.sub(r'\s+', ' ', m.group(0)) not in allowed]
    return [(line, figure) for line, figure in hits if line not in skip]


def check(root=ROOT):
    """Every problem of the docs' figures, one line each, ``file:line: ...`` first."""
    problems = []
    for name in docs(root):
        with open(os.path.join(root, name)) as f:
            text = f.read()
        for m, figure, problem in figures(text, root):
            where = f'{name}:{line_of(text, m.start())}'
            if problem:
                problems.append(f'{where}: {problem}')
            elif m.group(4) != figure:
                problems.append(f'{where}: the text says {m.group(4)!r}, '
                                f'{m.group(1)} gives {figure!r}')
        problems += [f'{name}:{line}: {figure!r} is a measured figure without a marker '
                     f'(tie it to a results file, or remove it)'
                     for line, figure in unmarked(name, text)]
    return problems


def write(root=ROOT):
    """Fill every marked figure from its file; returns the docs changed."""
    changed = []
    for name in docs(root):
        path = os.path.join(root, name)
        with open(path) as f:
            text = f.read()
        new, last = [], 0
        for m, figure, _ in figures(text, root):
            if figure is not None:
                new += [text[last:m.start(4)], figure]
                last = m.end(4)
        new = ''.join(new) + text[last:]
        if new != text:
            with atomic_write(path) as f:
                f.write(new)
            changed.append(name)
    return changed


#: The suite's two commands (README.md): the whole suite, and the fast loop.
SUITES = {'full': [sys.executable, '-m', 'pytest', '-q'],
          'fast': [sys.executable, '-m', 'pytest', '-q', '-m', 'not slow and not soak']}


def pytest_summary(output):
    """``(tests, seconds)`` from pytest's last line (``904 passed, 10 skipped in 690.32s``):
    the tests run (passed and failed) and skipped, and the seconds pytest measured."""
    line = output.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r'(\d+) (passed|failed|skipped|error)', line)}
    seconds = re.search(r' in ([\d.]+)s', line)
    if not counts or seconds is None:
        raise ValueError(f'not a pytest summary line: {line!r}')
    return sum(counts.values()), float(seconds.group(1))


def measure_suites(root=ROOT, run=subprocess.run):
    """Run each of ``SUITES`` in ``root``; return ``{name: {tests, seconds, passed}}``."""
    figures = {}
    for name, command in SUITES.items():
        proc = run(command, cwd=root, capture_output=True, text=True)
        tests, seconds = pytest_summary(proc.stdout)
        figures[name] = {'tests': tests, 'seconds': round(seconds), 'passed': proc.returncode == 0,
                         'command': shlex.join(['python'] + command[1:])}
        for line in proc.stdout.splitlines():  # pytest's short summary names what failed
            if line.startswith(('FAILED ', 'ERROR ')):
                print(f'{name}: {line}', file=sys.stderr)
    return figures


def record_suite_time(figures, root=ROOT):
    """Write ``docs/results/suite-time.json``: ``figures`` (``measure_suites``') with this
    machine and today's date."""
    path = os.path.join(root, RESULTS, 'suite-time.json')
    with atomic_write(path) as f:
        json.dump({**figures, **stamp()}, f, indent=2)
        f.write('\n')
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument('--check', action='store_true', help='report every problem, exit 1 if any')
    what.add_argument('--write', action='store_true',
                      help='fill the marked figures from their files, then check')
    what.add_argument('--suite-time', action='store_true',
                      help="run the test suite and its fast loop (README.md's commands, about 15 "
                           'minutes: nothing else should run), record their tests and times with '
                           'this machine and the date, then fill and check')
    args = parser.parse_args(argv)
    if args.suite_time:
        figures = measure_suites()
        print(f'written: {record_suite_time(figures)}: {figures}')
        if not all(f['passed'] for f in figures.values()):
            print('some tests failed: the times are recorded, fix the tests', file=sys.stderr)
            return 1
    if args.write or args.suite_time:
        for name in write():
            print(f'filled: {name}')
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())

"""The fault-injection harness: every entry point that writes, failed or killed at each of its
file-system calls, must leave the previous state or the complete new one, and nothing else.

Every call by which the package changes files goes through ``gluon_multigpu.filesafety.fs``, which
passes each to ``fs.hook`` first. For each entry point (``fault_entries.ENTRIES``, then
``fault_studies.ENTRIES``) the harness

1. puts the PREVIOUS state in a fresh folder (an earlier output of the package), and DECOYS of
   the user's beside it (a file, files and folders named like the package's temporary and
   staging ones, a file hard-linked at a lock's name);
2. runs the entry point once unfaulted, counting its ``fs`` calls (N) and taking the NEW state;
3. for every n in 1..N and every fault (``ENOSPC``, ``EIO`` or ``EFBIG`` raised at the n-th
   call, EFBIG after a write there let through half as a file-size limit does; or the process
   killed by SIGKILL there, in a forked child, after which ``output.recover`` runs on
   the entry point's folders; MXNet's engine works in the child, so the checkpoint's kills
   need no driver of their own), starts again from the previous state and checks that
   (a) the folder is byte-identical to the previous state or to the new one (or, for a study
   that keeps its rows as it goes, to the end of a shorter run: ``partial_runs``), (b) every decoy
   is byte-identical, (c) nothing else is left (no temporary or staging file; excused are a
   stale ``*.lock`` file after a kill, which the next run takes over, and the file whose
   removal was the call that failed), and
   (d) a failed call surfaces as ``OSError`` or ``GluonMultiGPUError``, never as a success
   with another state than the new one;
4. cuts the power before the first call and after each (``power_cut``): every state a power cut
   may leave there, built in memory from the unfaulted run's record (each call's changes, what
   each fsync made durable), is recovered in a fresh folder and checked for (a) to (c) as after
   a kill; after a run that returned, only the new state will do.

The unfaulted run is a case too: it must leave the decoys as they were and raise nothing but a
``GluonMultiGPUError`` (a refusal). An entry point that makes no ``fs`` call cannot be faulted:
that is a failure of its own. ``python tests/fault_harness.py --table`` prints the table of
docs/guide.md; ``--only NAME`` runs one entry point and lists what failed.
"""
import argparse
import atexit
import collections
import contextlib
import errno
import io
import os
import shutil
import select
import signal
import stat
import sys
import tempfile
import time

if __name__ == '__main__':  # run as a script: the package and the entries beside it
    sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    os.path.dirname(os.path.abspath(__file__))]

import gluon_multigpu as gm  # noqa: E402  (loads no MXNet)

gm.engine.configure()  # the engine settings of the tests, before MXNet loads

from gluon_multigpu.errors import GluonMultiGPUError  # noqa: E402
from gluon_multigpu.filesafety import fs  # noqa: E402
import fault_entries  # noqa: E402
import fault_studies  # noqa: E402
import power_cut  # noqa: E402

__all__ = ['ENTRIES', 'FAULTS', 'KINDS', 'Case', 'results', 'table', 'describe', 'TABLE_START',
           'TABLE_END']

#: The faults put at each call: an errno raised there, or the process killed there. EFBIG is a
#: file-size limit reached (``ulimit -f``): a write there writes half its bytes, which stay, and
#: the call after it fails; any other call fails there.
FAULTS = {'ENOSPC': errno.ENOSPC, 'EIO': errno.EIO, 'EFBIG': errno.EFBIG, 'SIGKILL': None}
#: The kinds of case: the unfaulted run, the faults, then the power cut (``power_cut``).
KINDS = ('unfaulted', *FAULTS, 'power cut')
#: Seconds a killed child may take before it counts as hung (a bound for a broken case only).
CHILD_DEADLINE = 120.0
TABLE_START, TABLE_END = '<!-- fault-table -->', '<!-- /fault-table -->'

#: Every entry point, in the order of the table.
ENTRIES = fault_entries.ENTRIES + fault_studies.ENTRIES

#: One case that did not hold: its kind, n, the call there, and what differed.
Case = collections.namedtuple('Case', 'kind n operation path problems')


# -- states -------------------------------------------------------------------------------------

def snapshot(root, entry=None):
    """Every path under ``root``: ``{relative path: (type, content[, links])}``.

    Files are ``('file', bytes, number of links)``, symbolic links ``('link', target)``,
    folders ``('dir',)``, anything else ``('other', its type)``. ``root`` itself in contents
    becomes ``<root>`` (a report may name its folder), and ``entry.normalize`` takes out what
    differs between two equal runs.
    """
    state, marker = {}, os.fsencode(root)
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                state[rel] = ('link', os.readlink(path).replace(root, '<root>'))
            elif stat.S_ISDIR(info.st_mode):
                state[rel] = ('dir',)
            elif stat.S_ISREG(info.st_mode):
                with open(path, 'rb') as f:
                    data = f.read().replace(marker, b'<root>')
                if entry is not None:
                    data = entry.normalize(rel, data)
                state[rel] = ('file', data, info.st_nlink)
            else:
                state[rel] = ('other', stat.S_IFMT(info.st_mode))
    return state


def _restore(state, root):
    """Put ``state`` (a ``snapshot`` taken without an entry) under ``root``."""
    for rel, record in sorted(state.items()):
        path = os.path.join(root, rel)
        if record[0] == 'dir':
            os.makedirs(path, exist_ok=True)
        elif record[0] == 'link':
            os.symlink(record[1], path)
        elif record[0] == 'file':
            with open(path, 'wb') as f:
                f.write(record[1])


def _is_under(rel, tops):
    return any(rel == t or rel.startswith(t + os.sep) for t in tops)


# -- one run -----------------------------------------------------------------------------------

class _Stage:
    """A fresh folder with an entry point's previous state (made once, copied) and its decoys."""
    templates = {}

    def __init__(self, entry, base):
        self.root = tempfile.mkdtemp(dir=base, prefix=f'{entry.name}-')
        if entry.name not in self.templates:
            made = tempfile.mkdtemp(dir=base, prefix='template-')
            entry.previous(made)
            self.templates[entry.name] = snapshot(made)
            shutil.rmtree(made)
        _restore(self.templates[entry.name], self.root)
        self.decoys = entry.decoys(self.root)
        self.old = snapshot(self.root, entry)

    def remove(self):
        shutil.rmtree(self.root, ignore_errors=True)


def _hook(calls, fault_at=None, errno_=None, short=None):
    """Count the calls; at call ``fault_at`` raise ``errno_`` (None: SIGKILL). With ``short``
    (EFBIG), a write there is let through half (``_ShortWrite``) and the call after it fails."""
    def hook(operation, path):
        calls.append((operation, path))
        if len(calls) == fault_at and errno_ is None:
            os.kill(os.getpid(), signal.SIGKILL)
        if len(calls) == fault_at and short is not None and operation == 'write':
            short.append(path)
        elif len(calls) == fault_at or (short and len(calls) == fault_at + 1):
            raise OSError(errno_, os.strerror(errno_), path)
    return hook


class _ShortWrite:
    """``os`` as ``fs`` sees it, but for the write ``armed`` asks for: it writes half its bytes
    and says so, as a write that reaches a file-size limit does."""

    def __init__(self, armed):
        self.armed = armed

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if len(self.armed) == 1:
            self.armed.append('written')
            return os.write(fd, bytes(data[:len(data) // 2]))
        return os.write(fd, data)


@contextlib.contextmanager
def _short_writes(armed):
    real, fs.os = fs.os, _ShortWrite(armed) if armed is not None else fs.os
    try:
        yield
    finally:
        fs.os = real


class _Charts:
    """Charts drawn once per entry point (in its unfaulted run), their bytes replayed after.

    Drawing a chart takes a tenth of a second, and a report's writer draws several in each of
    its cases: ``Figure.savefig`` draws into memory and writes the bytes to the file object in
    one ``write``, recorded in order; in the cases the recorded bytes are written instead (and
    ``tight_layout``, which only moves what is drawn, is skipped). The file-system calls and
    the bytes written are the same.
    """
    recorded = {}

    @classmethod
    @contextlib.contextmanager
    def patched(cls, name, record):
        try:
            from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
        except ImportError:
            yield
            return
        savefig, tight_layout = Figure.savefig, Figure.tight_layout
        charts = cls.recorded.setdefault(name, []) if record else list(cls.recorded.get(name, ()))
        replay = not record and bool(charts)

        def save(fig, fname, *args, **kwargs):
            if replay and charts and hasattr(fname, 'write'):
                fname.write(charts.pop(0))
                return None
            if not hasattr(fname, 'write'):
                return savefig(fig, fname, *args, **kwargs)
            buffer = io.BytesIO()
            savefig(fig, buffer, *args, **kwargs)
            if record:
                charts.append(buffer.getvalue())
            fname.write(buffer.getvalue())
            return None

        Figure.savefig = save
        if replay:
            Figure.tight_layout = lambda fig, *args, **kwargs: None
        try:
            yield
        finally:
            Figure.savefig, Figure.tight_layout = savefig, tight_layout


def _act(entry, root, hook, record=False):
    """Run the entry point under ``hook``; return the exception it raised (or None)."""
    fs.hook = hook
    try:
        with _Charts.patched(entry.name, record):
            entry.act(root)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # pylint: disable=broad-except
        return e
    finally:
        fs.hook = None
    return None


def _killed(entry, root, n):
    """Run the entry point in a forked child killed at its n-th call; return what went wrong."""
    pid = os.fork()
    if pid == 0:  # the child: never back into the caller's code
        code = 0
        try:
            code = 3 if _act(entry, root, _hook([], fault_at=n)) is not None else 0
        finally:
            os._exit(code)  # pylint: disable=protected-access
    ended = os.pidfd_open(pid)  # readable once the child has ended: no polling
    try:
        hung = not select.select([ended], [], [], CHILD_DEADLINE)[0]
    finally:
        os.close(ended)
    if hung:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return [f'the child did not reach call {n} within {CHILD_DEADLINE:g} s (hung)']
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return []
    how = 'raised an error' if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3 else \
        f'ended with status {status}'
    return [f'the child {how} before call {n} (the calls differ from the unfaulted run)']


class Reference:
    """An entry point run unfaulted: its calls (relative paths), the new state, its problems;
    the previous state, the decoys and the run's record (``power_cut``)."""

    def __init__(self, entry, base):
        stage = _Stage(entry, base)
        calls, self.old, self.decoys, self.states = [], stage.old, stage.decoys, 0
        with power_cut.Recorder(stage.root) as self.recorder:
            error = _act(entry, stage.root, _hook(calls), record=True)
        self.new = snapshot(stage.root, entry)
        self.calls = [(op, os.path.relpath(p, stage.root) if p else '') for op, p in calls]
        self.problems = _decoy_problems(stage, self.new)
        if error is not None and not isinstance(error, GluonMultiGPUError):
            self.problems.append(f'raised {type(error).__name__}: {error}')
        self.error = error
        stage.remove()
        self.partial = []  # the ends of shorter runs of a writer that keeps its results as it goes
        for act in entry.partial_runs():
            stage = _Stage(entry, base)
            act(stage.root)
            self.partial.append(snapshot(stage.root, entry))
            stage.remove()


def _decoy_problems(stage, after):
    problems = []
    for rel in sorted(p for p in stage.old if _is_under(p, stage.decoys)):
        now, was = after.get(rel), stage.old[rel]
        if now != was:
            how = 'removed' if now is None else 'lost a hard link' if \
                now[:2] == was[:2] and now[0] == 'file' else 'changed'
            problems.append(f"the user's {rel} was {how}" if how != 'lost a hard link' else
                            f"the user's {rel} {how} (at a lock's name)")
    return problems


def _state_problems(stage, ref, after, killed, removing=None):
    """What in ``after`` is neither the previous nor the new state (decoys aside).

    Excused: a stale ``*.lock`` file after a kill (the next run takes it over), and the file
    or folder whose removal was the call that failed (``removing``: nothing else could).
    """
    def ours(state):
        return {p: r for p, r in state.items() if not _is_under(p, stage.decoys)}
    old, new, now = ours(stage.old), ours(ref.new), ours(after)
    left = sorted(p for p in now if p not in old and p not in new)
    stale = [p for p in left if p == removing or
             (killed and p.endswith('.lock') and now[p][0] == 'file')]
    problems = [f'{p} is left' for p in left if p not in stale][:3]
    now = {p: r for p, r in now.items() if p not in left}
    if problems or now == old or now == new or any(now == ours(s) for s in ref.partial):
        return problems
    mixed = []
    for rel in sorted(set(old) | set(new) | set(now)):
        if now.get(rel) == new.get(rel) != old.get(rel):
            mixed.append(f'{rel} {"new" if rel in now else "removed"}')
        elif now.get(rel) == old.get(rel) != new.get(rel):
            mixed.append(f'{rel} {"old" if rel in now else "not made"}')
        elif now.get(rel) not in (old.get(rel), new.get(rel)):
            mixed.append(f'{rel} {"missing" if rel not in now else "neither old nor new"}')
    return ['neither the previous state nor the new one: ' + ', '.join(mixed[:4])]


def run_case(entry, ref, kind, n, base):
    """Run one case; return the list of what did not hold (empty: it held)."""
    stage = _Stage(entry, base)
    try:
        return _case(entry, ref, kind, n, stage)
    except Exception as e:  # pylint: disable=broad-except  # e.g. a recovery that raised
        return [f'{type(e).__name__} after the fault: {e}']
    finally:
        stage.remove()


def _case(entry, ref, kind, n, stage):
    """One case in ``stage``: the entry point faulted at call ``n``, then checked."""
    calls, error = [], None
    if kind == 'SIGKILL':
        problems = _killed(entry, stage.root, n)
        entry.recover(stage.root)
    else:
        short = [] if kind == 'EFBIG' else None
        with _short_writes(short):
            error = _act(entry, stage.root, _hook(calls, n, FAULTS[kind], short))
        problems = []
        n += bool(short)  # the call that failed: after a write let through half, the next
    after = snapshot(stage.root, entry)
    problems += _decoy_problems(stage, after)
    removing = None
    if kind != 'SIGKILL' and len(calls) >= n and calls[n - 1][0] in ('unlink', 'rmdir'):
        removing = os.path.relpath(calls[n - 1][1], stage.root)
    problems += _state_problems(stage, ref, after, kind == 'SIGKILL', removing)
    if kind != 'SIGKILL':
        if error is None and ref.error is None and after != ref.new:
            problems.append(f'{kind} at this call was not raised, and the state is not '
                            'the new one')
        elif error is not None and not isinstance(error, (OSError, GluonMultiGPUError)):
            problems.append(f'raised {type(error).__name__}: {error}')
    return problems


# -- all cases ----------------------------------------------------------------------------------

_REFERENCES, _RESULTS = {}, {}


def _entry(name):
    for entry in ENTRIES:
        if entry.name == name:
            return entry
    raise KeyError(f'no entry point {name!r}; the entry points: '
                   f'{", ".join(e.name for e in ENTRIES)}')


def _base():
    if 'base' not in _REFERENCES:
        shm = '/dev/shm' if os.access('/dev/shm', os.W_OK) else None  # fsync costs nothing
        _REFERENCES['base'] = tempfile.mkdtemp(prefix='gluon-multigpu-faults-', dir=shm)
        atexit.register(shutil.rmtree, _REFERENCES['base'], True)
    return _REFERENCES['base']


def reference(name):
    """The unfaulted run of entry point ``name`` (made once)."""
    if name not in _REFERENCES:
        _REFERENCES[name] = Reference(_entry(name), _base())
    return _REFERENCES[name]


def results(name, kind):
    """``(cases run, [Case that did not hold, ...])`` for entry point ``name`` and ``kind``."""
    if (name, kind) not in _RESULTS:
        entry, ref = _entry(name), reference(name)
        if kind == 'unfaulted':
            failed = [Case(kind, 0, '', '', ref.problems)] if ref.problems else []
            _RESULTS[name, kind] = (1, failed)
        elif not ref.calls:
            _RESULTS[name, kind] = (0, [Case(kind, 0, '', '', [
                'it made no call through gluon_multigpu.filesafety.fs, so no fault could be put '
                'into it (its writer is not on the output layer)'])])
        elif kind == 'power cut':
            _RESULTS[name, kind] = power_cut.results(entry, ref, sys.modules[__name__])
        else:
            failed = []
            for n, (operation, path) in enumerate(ref.calls, start=1):
                problems = run_case(entry, ref, kind, n, _base())
                if problems:
                    failed.append(Case(kind, n, operation, path, problems))
            _RESULTS[name, kind] = (len(ref.calls), failed)
    return _RESULTS[name, kind]


def describe(name, kind, failed, limit=4):
    """Lines naming the first ``limit`` cases in ``failed``: n, the call there, what differed."""
    lines = [f'{name}, {kind}: {len(failed)} case(s) did not hold']
    for case in failed[:limit]:
        at, cut = ('after', ' before any call') if case.kind == 'power cut' else ('at', '')
        where = f' {at} call {case.n} ({case.operation} {case.path})' if case.n else cut
        lines.append(f'  {case.kind}{where}: {"; ".join(case.problems)}')
    if len(failed) > limit:
        lines.append(f'  ... and {len(failed) - limit} more')
    return '\n'.join(lines)


def table(names=None):
    """The Markdown table of docs/guide.md: entry point, faults, cases run (of every kind), cases
    that held; of the power cut, the points that held and the distinct states checked."""
    rows = ['| entry point | faults | cases run | held | power cuts held (states) |',
            '| --- | --- | ---: | --- | --- |']
    for entry in ENTRIES:
        if names and entry.name not in names:
            continue
        counts = [results(entry.name, kind) for kind in KINDS]
        calls = len(reference(entry.name).calls)
        faults = (f'none; {", ".join(FAULTS)} at each of its {calls} call{"s" if calls > 1 else ""}'
                  '; a power cut before them and after each' if calls else
                  'none (it makes no call through `filesafety/fs`)')
        run = sum(c[0] for c in counts)
        held = run - sum(len(c[1]) for c in counts if c[0])
        said = 'all' if held == run and calls else f'{held} of {run}' + \
            ('' if calls else '; no fault could be put')
        power = power_cut.cell(*results(entry.name, 'power cut'), reference(entry.name)) \
            if calls else 'none'
        rows.append(f'| `{entry.name}`: {entry.what} | {faults} | {run} | {said} | {power} |')
    return '\n'.join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--table', action='store_true', help='print the table of docs/guide.md')
    p.add_argument('--only', action='append', metavar='NAME', help='run this entry point only')
    args = p.parse_args(argv)
    names = args.only or [e.name for e in ENTRIES]
    start, failures = time.monotonic(), 0
    for name in names:
        for kind in KINDS:
            _, failed = results(name, kind)
            if failed and not args.table:
                print(describe(name, kind, failed))
            failures += bool(failed)
    if args.table:
        print(table(names))
    print(f'{failures} (entry point, kind) pair(s) did not hold; '
          f'{time.monotonic() - start:.0f} s', file=sys.stderr)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())

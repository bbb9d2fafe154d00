"""The power-cut kind of the fault-injection harness (``fault_harness``): what a power cut at
any point of an entry point's run may leave on disk, each such state recovered and checked.

A kill leaves every call made so far in place; a power cut leaves only what was fsynced. While
the entry point's unfaulted run goes (``Recorder``, on ``fs.trace``), the harness reads the
folder at each call: which name leads to which inode, and at an ``fsync`` the file's bytes or,
for a folder, that its names are now durable. The changes between two calls are one directory
operation, kept or lost whole (a rename is atomic), and certain once the folder of each name it
makes (of each name it removes, if it makes none) has been fsynced after it. After 0, 1, ..., N
calls (the last point: the entry point has returned) a power cut may leave (``Model.states``):

- the previous state, which is durable, changed by every certain operation;
- and by any subset of the pending ones, in their order, when at most ``SUBSETS`` are pending;
  else by each prefix of them (a journal commits in order);
- each file with its bytes as of its last fsync, as before the run if never fsynced then, or
  empty if it is new and was never fsynced (an ``fs.external`` write of MXNet's included).

Each distinct state is put in a fresh folder at the run's own path (inodes with several names
hard-linked again), ``entry.recover`` runs on it, and it is checked as a kill is: the previous
state or the new one (or a shorter run's end), the user's files untouched, nothing left but a
stale ``*.lock`` with a content a kill could leave too (an empty one the next run refuses). At
the last point of a run that returned, only the new state will do: a completed write must
outlive a power cut. A point is one case; it fails if any of its states does. Files are told
apart by inode number: on /dev/shm, the harness's base, a number is not used twice in a run.
"""
import collections
import contextlib
import io
import itertools
import os
import shutil
import stat
import types

from gluon_multigpu.filesafety import fs

__all__ = ['Recorder', 'Model', 'results', 'cell', 'SUBSETS']

#: Up to this many pending operations, every subset of them is tried; beyond, every prefix.
SUBSETS = 4
#: An inode's kind, from its mode.
_KINDS = {stat.S_IFREG: 'file', stat.S_IFDIR: 'dir', stat.S_IFLNK: 'link'}


class Recorder:
    """An entry point's unfaulted run as the model needs it: the names at each call, what each
    fsync made durable (a context manager: ``fs.trace`` is set inside)."""

    def __init__(self, root):
        self.root = root
        self.kinds, self.targets, self.start_data = {}, {}, {}
        self.locks = collections.defaultdict(set)  # a ``*.lock`` file: each content it had
        self.top = os.lstat(root).st_ino
        self.start = self._names(self.start_data)
        self.steps, self.end = [], None  # per call: (names at its hook, what it fsyncs)

    def __enter__(self):
        fs.trace = self.trace
        return self

    def __exit__(self, *exc):
        fs.trace = None
        self.end = self._names()
        return False

    def trace(self, operation, path, fd):  # pylint: disable=unused-argument
        synced = None
        if operation == 'fsync' and fd is not None:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                synced = ('dir', info.st_ino, None)
            elif stat.S_ISREG(info.st_mode):
                synced = ('file', info.st_ino, self._read(f'/proc/self/fd/{fd}', fd))
        self.steps.append((self._names(), synced))

    def _names(self, data=None):
        """``{(folder inode, name): inode}`` for everything under the root (kinds noted; with
        ``data``, each file's bytes put there too)."""
        names, folders = {}, [(self.top, self.root)]
        while folders:
            folder, path = folders.pop()
            with os.scandir(path) as listing:
                for item in listing:
                    info = item.stat(follow_symlinks=False)
                    names[folder, item.name] = info.st_ino
                    kind = _KINDS.get(stat.S_IFMT(info.st_mode), 'other')
                    self.kinds.setdefault(info.st_ino, kind)
                    if kind == 'dir':
                        folders.append((info.st_ino, item.path))
                    elif kind == 'link' and info.st_ino not in self.targets:
                        self.targets[info.st_ino] = os.readlink(item.path)
                    if kind == 'file' and data is not None:
                        data[info.st_ino] = self._read(item.path)
                    if kind == 'file' and item.name.endswith('.lock'):
                        self.locks[os.path.relpath(item.path, self.root)].add(
                            self._read(item.path))
        return names

    def _read(self, path, fd=None):
        try:
            with open(path, 'rb') as f:
                data = f.read()
        except OSError:  # not to be opened again: read through the descriptor itself
            data, offset = b'', 0
            while chunk := os.pread(fd, 1 << 20, offset):
                data, offset = data + chunk, offset + len(chunk)
        return data


def _change(before, after):
    """The directory operation between two namings: ``{(folder, name): inode or None}``."""
    change = {key: ino for key, ino in after.items() if before.get(key) != ino}
    change.update({key: None for key in before if key not in after})
    return change


class Model:
    """What a power cut may leave after each point of a recorded run (``states(point)``)."""

    def __init__(self, recorder):
        self.rec = recorder
        namings = [recorder.start] + [names for names, _ in recorder.steps] + [recorder.end]
        # operation i (0 .. N): what changed from the hook of call i to that of call i + 1 (call
        # 0: before the first call; the last: up to the end); point p holds operations 0 .. p
        self.operations = [_change(a, b) for a, b in zip(namings, namings[1:])]
        self.folder_syncs = collections.defaultdict(list)  # folder inode: its fsync calls
        self.file_syncs = collections.defaultdict(list)  # file inode: [(call, bytes)]
        for call, (_, synced) in enumerate(recorder.steps, start=1):
            if synced and synced[0] == 'dir':
                self.folder_syncs[synced[1]].append(call)
            elif synced:
                self.file_syncs[synced[1]].append((call, synced[2]))
        self.points = len(recorder.steps) + 1

    def _homes(self, i):
        change = self.operations[i]
        made = {folder for (folder, _), ino in change.items() if ino is not None}
        return made or {folder for folder, _ in change}

    def _certain(self, i, point):
        return all(any(i < call <= point for call in self.folder_syncs.get(home, ()))
                   for home in self._homes(i))

    def _data(self, ino, point):
        synced = [data for call, data in self.file_syncs.get(ino, ()) if call <= point]
        return synced[-1] if synced else self.rec.start_data.get(ino, b'')

    def pending(self, point):
        """The operations up to ``point`` that a power cut there may have lost."""
        return [i for i in range(point + 1)
                if self.operations[i] and not self._certain(i, point)]

    def states(self, point):
        """Each state a power cut after ``point`` calls may leave: ``[(path, kind, payload,
        first path of its inode), ...]`` sorted (equal lists: equal states)."""
        pending = self.pending(point)
        if len(pending) <= SUBSETS:
            choices = [set(itertools.compress(pending, keep))
                       for keep in itertools.product((False, True), repeat=len(pending))]
        else:
            choices = [set(pending[:k]) for k in range(len(pending) + 1)]
        for kept in choices:
            names = dict(self.rec.start)
            for i in range(point + 1):
                if i in kept or (self.operations[i] and i not in pending):
                    for key, ino in self.operations[i].items():
                        if ino is None:
                            names.pop(key, None)
                        else:
                            names[key] = ino
            yield self._tree(names, point)

    def _tree(self, names, point):
        children = collections.defaultdict(dict)
        for (folder, name), ino in names.items():
            children[folder][name] = ino
        found, first, folders, seen = [], {}, [(self.rec.top, '')], {self.rec.top}
        while folders:
            folder, rel = folders.pop()
            for name, ino in sorted(children[folder].items()):
                path, kind = os.path.join(rel, name), self.rec.kinds[ino]
                if kind == 'dir' and ino not in seen:
                    seen.add(ino)
                    folders.append((ino, path))
                payload = self._data(ino, point) if kind == 'file' else \
                    self.rec.targets.get(ino, '')
                found.append((path, kind, payload, ino))
        found.sort()
        for path, _, _, ino in found:
            first.setdefault(ino, path)
        return tuple((path, kind, payload, first[ino]) for path, kind, payload, ino in found)


def materialise(state, root):
    """Make ``state`` (one of ``Model.states``) under the empty folder ``root``."""
    for path, kind, payload, first in state:  # sorted: a folder before what it holds
        where = os.path.join(root, path)
        if kind == 'dir':
            os.mkdir(where)
        elif kind == 'link':
            os.symlink(payload, where)
        elif kind == 'file' and first != path:
            os.link(os.path.join(root, first), where)
        elif kind == 'file':
            with open(where, 'wb') as f:
                f.write(payload)


def _check(entry, ref, state, harness):
    """Recover ``state`` in a fresh folder at the recorded run's place (the same path: a name
    that carries a hash of its file's content stays true): ``(problems, the snapshot after)``."""
    root = ref.recorder.root
    shutil.rmtree(root, ignore_errors=True)
    os.mkdir(root, 0o700)
    try:
        materialise(state, root)
        with contextlib.redirect_stderr(io.StringIO()):  # a stale lock taken over is said
            entry.recover(root)
        after = harness.snapshot(root, entry)
    except Exception as e:  # pylint: disable=broad-except  # e.g. a recovery that raised
        return [f'{type(e).__name__} after the power cut: {e}'], None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    stage = types.SimpleNamespace(old=ref.old, decoys=ref.decoys)
    problems = harness._decoy_problems(stage, after) + \
        harness._state_problems(stage, ref, after, True)  # pylint: disable=protected-access
    return problems + [f'{p} is left {"empty" if not r[1] else "cut short"}, as no kill leaves it '
                       '(its content was never fsynced): the next run refuses it' for p, r in
                       sorted(after.items()) if p.endswith('.lock') and r[0] == 'file' and
                       p not in ref.old and r[1] not in ref.recorder.locks.get(p, ())], after


def _lost(ref, after, harness):
    """At the end of a run that returned: what differs from the new state (a stale lock
    aside)."""
    def ours(state):
        return {p: r for p, r in state.items() if not harness._is_under(p, ref.decoys) and  # noqa
                not (p.endswith('.lock') and r[0] == 'file' and p not in ref.new)}
    now, new, old = ours(after), ours(ref.new), ours(ref.old)
    said = []
    for p in sorted(set(now) | set(new)):
        if now.get(p) != new.get(p):
            said.append(f'{p} missing' if p not in now else f'{p} left' if p not in new else
                        f'{p} old' if now[p] == old.get(p) else f'{p} empty' if
                        now[p][:2] == ('file', b'') else f'{p} neither old nor new')
    return ['the entry point had returned, yet the new state did not outlive the power cut: ' +
            ', '.join(said[:4])] if said else []


def results(entry, ref, harness):
    """``(points, [Case that did not hold, ...])`` of the power-cut kind; ``ref.states``
    becomes the number of distinct states checked."""
    model, checked, failed = Model(ref.recorder), {}, []
    for point in range(model.points):
        problems = []
        for state in dict.fromkeys(model.states(point)):
            if state not in checked:
                checked[state] = _check(entry, ref, state, harness)
            found, after = checked[state]
            if not found and after is not None and point == model.points - 1 and \
                    ref.error is None:
                found = _lost(ref, after, harness)
            problems += [p for p in found if p not in problems]
        if problems:
            operation, path = ref.calls[point - 1] if point else ('', '')
            failed.append(harness.Case('power cut', point, operation, path, problems[:3]))
    ref.states = len(checked)
    return model.points, failed


def cell(points, failed, ref):
    """The table's cell: the points that held of all, and the distinct states checked."""
    return f'{"all" if not failed else f"{points - len(failed)} of"} {points} ({ref.states})'

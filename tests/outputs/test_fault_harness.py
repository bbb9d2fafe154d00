"""Every entry point that writes, failed (ENOSPC, EIO) or killed (SIGKILL) at each of its
file-system calls: the previous state or the complete new one, the user's files untouched,
nothing left (``fault_harness``). And the harness itself: it holds for a writer that keeps the
rules and catches one that does not; docs/guide.md has its table."""
import os
import pathlib

import pytest

import fault_harness
from fault_entries import Entry, user_file
from gluon_multigpu.base import fs

REPO = pathlib.Path(__file__).resolve().parents[2]
CASES = [(e.name, kind) for e in fault_harness.ENTRIES for kind in fault_harness.KINDS]


@pytest.mark.parametrize('name, kind', CASES)
def test_an_entry_point_keeps_the_old_state_or_makes_the_new_one(name, kind):
    run, failed = fault_harness.results(name, kind)
    if failed:
        pytest.fail(fault_harness.describe(name, kind, failed), pytrace=False)
    assert run >= 1


def test_docs_guide_holds_the_table_the_harness_makes():
    text = (REPO / 'docs' / 'guide.md').read_text()
    start, end = fault_harness.TABLE_START, fault_harness.TABLE_END
    assert text.count(start) == 1 and text.count(end) == 1, 'the markers of the fault table'
    inside = text.split(start, 1)[1].split(end, 1)[0].strip()
    made = fault_harness.table()
    assert inside == made, ('docs/guide.md: the fault table differs from the harness\'s; run '
                            f'`python tests/fault_harness.py --table` and paste it:\n{made}')


# -- the harness on writers of its own --------------------------------------------------------

def _write_through_fs(path, data, atomic):
    """Write ``data`` to ``path`` with ``fs`` calls: through a temporary file, or in place."""
    target = path + '.tmp-own' if atomic else path
    fd = fs.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fs.write(fd, data[:4], target)
        fs.write(fd, data[4:], target)
        fs.fsync(fd, target)
    except BaseException:
        os.close(fd)
        if atomic:
            fs.unlink(target)
        raise
    os.close(fd)
    if atomic:
        try:
            fs.replace(target, path)
        except BaseException:
            fs.unlink(target)
            raise


class Atomic(Entry):
    name, what = 'atomic', 'a writer through a temporary file'

    def previous(self, root):
        _write_through_fs(os.path.join(root, 'out.txt'), b'the previous text\n', True)

    def act(self, root):
        _write_through_fs(os.path.join(root, 'out.txt'), b'the new text, longer\n', True)

    def recover(self, root):
        if os.path.exists(os.path.join(root, 'out.txt.tmp-own')):
            os.unlink(os.path.join(root, 'out.txt.tmp-own'))


class InPlace(Atomic):
    name, what = 'in_place', 'a writer that truncates the file and writes in place'

    def act(self, root):
        _write_through_fs(os.path.join(root, 'out.txt'), b'the new text, longer\n', False)


class Swallowing(Atomic):
    name, what = 'swallowing', 'a writer that ignores a failed write'

    def act(self, root):
        try:
            _write_through_fs(os.path.join(root, 'out.txt'), b'the new text, longer\n', True)
        except OSError:
            pass


class Tidying(Atomic):
    name, what = 'tidying', 'a writer that removes what looks like its own temporary files'

    def decoys(self, root):
        return [user_file(root, 'out.txt.tmp-mine')]

    def act(self, root):
        fs.unlink(os.path.join(root, 'out.txt.tmp-mine'))
        super().act(root)


class Locking(Atomic):
    name, what = 'locking', 'a writer holding a lock file while it writes'

    def act(self, root):
        lock = os.path.join(root, '.out.txt.lock')
        fd = fs.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fs.write(fd, b'123\n', lock)
            super().act(root)
        finally:
            os.close(fd)
            fs.unlink(lock)


class Progressive(Atomic):
    name, what = 'progressive', 'a writer that keeps its rows as it goes'

    def act(self, root, rows=2):
        for k in range(1, rows + 1):
            _write_through_fs(os.path.join(root, 'out.txt'), f'{k} row(s)\n'.encode(), True)

    def partial_runs(self):
        return [lambda root: self.act(root, rows=1)]


@pytest.fixture
def own_entries(monkeypatch):
    entries = [Atomic(), InPlace(), Swallowing(), Tidying(), Locking(), Progressive()]
    monkeypatch.setattr(fault_harness, 'ENTRIES', entries)
    monkeypatch.setattr(fault_harness, '_REFERENCES', {})
    monkeypatch.setattr(fault_harness, '_RESULTS', {})
    monkeypatch.setattr(fault_harness._Stage, 'templates', {})
    return entries


def test_the_harness_holds_for_a_writer_that_keeps_the_rules(own_entries):
    assert fault_harness.reference('atomic').calls == [
        ('open', 'out.txt.tmp-own'), ('write', 'out.txt.tmp-own'), ('write', 'out.txt.tmp-own'),
        ('fsync', 'out.txt.tmp-own'), ('replace', 'out.txt')]
    for kind in fault_harness.KINDS:
        run, failed = fault_harness.results('atomic', kind)
        assert (run, failed) == (1 if kind == 'unfaulted' else 5, []), failed


def test_the_harness_catches_a_writer_that_writes_in_place(own_entries):
    for kind in ('ENOSPC', 'SIGKILL'):
        run, failed = fault_harness.results('in_place', kind)
        assert run == 4 and [c.n for c in failed] == [2, 3], failed  # truncated, or half written
        assert failed[0].operation == 'write' and failed[0].path == 'out.txt'
        assert 'neither the previous state nor the new one: out.txt neither old nor new' in \
            failed[0].problems[0]
    message = fault_harness.describe('in_place', 'SIGKILL', failed)
    assert 'SIGKILL at call 2 (write out.txt)' in message


def test_the_harness_catches_a_silent_failure_and_a_removed_decoy(own_entries):
    _, failed = fault_harness.results('swallowing', 'EIO')
    assert [c.n for c in failed] == [1, 2, 3, 4, 5]
    assert 'EIO at this call was not raised, and the state is not the new one' in \
        failed[0].problems
    _, failed = fault_harness.results('tidying', 'unfaulted')
    assert failed[0].problems == ["the user's out.txt.tmp-mine was removed"]


def test_the_harness_says_when_an_entry_point_makes_no_fs_call(own_entries, monkeypatch):
    monkeypatch.setattr(Atomic, 'act', lambda self, root: None)
    run, failed = fault_harness.results('atomic', 'ENOSPC')
    assert run == 0 and 'no call through gluon_multigpu.base.fs' in failed[0].problems[0]


def test_a_stale_lock_after_a_kill_a_failed_removal_and_a_shorter_run_are_no_failures(
        own_entries, monkeypatch):
    for name, calls in (('locking', 8), ('progressive', 10)):
        for kind in fault_harness.FAULTS:
            assert fault_harness.results(name, kind) == (calls, []), (name, kind)
    monkeypatch.setattr(Progressive, 'partial_runs', lambda self: [])
    monkeypatch.setattr(fault_harness, '_REFERENCES', {})
    monkeypatch.setattr(fault_harness, '_RESULTS', {})
    _, failed = fault_harness.results('progressive', 'SIGKILL')
    assert [c.n for c in failed] == [6, 7, 8, 9, 10]  # the first row kept, the second not yet

"""Every entry point that writes, failed (ENOSPC, EIO, EFBIG) or killed (SIGKILL) at each of its
file-system calls, or its power cut before any and after each (``power_cut``): the previous
state or the complete new one, the user's files untouched, nothing left (``fault_harness``). And
the harness itself: it holds for a writer that keeps the rules and catches one that does not
(the classic three of the power cut included); docs/guide.md has its table."""
import os
import pathlib

import pytest

import fault_harness
import power_cut
from fault_entries import Entry, user_file
from gluon_multigpu.filesafety import fs

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

def _write_through_fs(path, data, atomic, mistake=None):
    """Write ``data`` to ``path`` with ``fs`` calls: through a temporary file (fsynced, renamed,
    the folder fsynced), or in place. ``mistake`` plants one of the classic three in the first:
    no ``'file fsync'`` before the rename, no ``'folder fsync'`` after it, or the rename made
    before the data is written (``'rename first'``)."""
    target = path + '.tmp-own' if atomic else path
    fd = fs.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mistake == 'rename first':
            fs.replace(target, path)
            target = path
        fs.write(fd, data[:4], target)
        fs.write(fd, data[4:], target)
        if mistake != 'file fsync':
            fs.fsync(fd, target)
    except BaseException:
        os.close(fd)
        if target != path:
            fs.unlink(target)
        raise
    os.close(fd)
    if target != path:
        try:
            fs.replace(target, path)
        except BaseException:
            fs.unlink(target)
            raise
    if atomic and mistake != 'folder fsync':
        folder = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fs.fsync(folder, os.path.dirname(path))
        finally:
            os.close(folder)


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


class WholeLocking(Atomic):
    """A writer holding a lock made whole before it has its name, as the package's locks are:
    written unnamed (``O_TMPFILE``), fsynced (``synced``), then linked."""
    name, what, synced = 'whole_locking', 'a writer holding a lock linked whole', True

    def act(self, root):
        lock = os.path.join(root, '.out.txt.lock')
        fd = fs.open(root, os.O_TMPFILE | os.O_WRONLY, 0o644)
        try:
            fs.write(fd, b'123\n', lock)
            if self.synced:
                fs.fsync(fd, lock)
            fs.link_unnamed(fd, lock)
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


class Careless(Atomic):
    """A writer through a temporary file that makes one of the classic mistakes (``mistake``)."""
    mistake = None

    def act(self, root):
        _write_through_fs(os.path.join(root, 'out.txt'), b'the new text, longer\n', True,
                          self.mistake)


class NoFileFsync(Careless):
    name, what, mistake = 'no_file_fsync', 'a writer that renames data it never fsynced', \
        'file fsync'


class NoFolderFsync(Careless):
    name, what, mistake = 'no_folder_fsync', 'a writer that never fsyncs the folder', \
        'folder fsync'


class RenameFirst(Careless):
    name, what, mistake = 'rename_first', 'a writer that renames before it writes', \
        'rename first'


@pytest.fixture
def own_entries(monkeypatch):
    entries = [Atomic(), InPlace(), Swallowing(), Tidying(), Locking(), WholeLocking(),
               Progressive(), NoFileFsync(), NoFolderFsync(), RenameFirst()]
    monkeypatch.setattr(fault_harness, 'ENTRIES', entries)
    monkeypatch.setattr(fault_harness, '_REFERENCES', {})
    monkeypatch.setattr(fault_harness, '_RESULTS', {})
    monkeypatch.setattr(fault_harness._Stage, 'templates', {})
    return entries


def test_the_harness_holds_for_a_writer_that_keeps_the_rules(own_entries):
    assert fault_harness.reference('atomic').calls == [
        ('open', 'out.txt.tmp-own'), ('write', 'out.txt.tmp-own'), ('write', 'out.txt.tmp-own'),
        ('fsync', 'out.txt.tmp-own'), ('replace', 'out.txt'), ('fsync', '.')]
    for kind in fault_harness.KINDS:
        run, failed = fault_harness.results('atomic', kind)
        # a power cut after each of the 6 calls, the last after it returned, and before any
        assert (run, failed) == ({'unfaulted': 1, 'power cut': 7}.get(kind, 6), []), failed


def test_the_harness_catches_a_writer_that_writes_in_place(own_entries):
    for kind in ('ENOSPC', 'EFBIG', 'SIGKILL'):
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
    assert run == 0 and 'no call through gluon_multigpu.filesafety.fs' in failed[0].problems[0]


def test_a_stale_lock_after_a_kill_a_failed_removal_and_a_shorter_run_are_no_failures(
        own_entries, monkeypatch):
    for name, calls in (('locking', 9), ('whole_locking', 11), ('progressive', 12)):
        for kind in (*fault_harness.FAULTS, 'power cut'):
            assert fault_harness.results(name, kind) == (calls + (kind == 'power cut'), []), \
                (name, kind)
    monkeypatch.setattr(Progressive, 'partial_runs', lambda self: [])
    monkeypatch.setattr(WholeLocking, 'synced', False)  # a power cut may leave it empty
    monkeypatch.setattr(fault_harness, '_REFERENCES', {})
    monkeypatch.setattr(fault_harness, '_RESULTS', {})
    _, failed = fault_harness.results('progressive', 'SIGKILL')
    assert [c.n for c in failed] == [6, 7, 8, 9, 10, 11]  # the first row kept, the second not yet
    _, failed = fault_harness.results('progressive', 'power cut')
    assert [c.n for c in failed] == [5, 6, 7, 8, 9, 10, 11]  # from the first row's rename on
    # a stale lock is excused as it is after a kill, not one emptied by a power cut (refused)
    assert fault_harness.results('whole_locking', 'SIGKILL')[1] == []
    _, failed = fault_harness.results('whole_locking', 'power cut')
    assert [c.n for c in failed] == [3, 4, 5, 6, 7, 8, 9, 10], failed
    assert failed[0].problems == ['.out.txt.lock is left empty, as no kill leaves it (its content '
                                  'was never fsynced): the next run refuses it'], failed


# -- the power cut: what only an fsync makes certain ---------------------------------------------

def test_a_power_cut_after_a_rename_of_data_never_fsynced_leaves_an_empty_file(own_entries):
    assert fault_harness.results('no_file_fsync', 'SIGKILL') == (5, [])  # a kill cannot tell
    run, failed = fault_harness.results('no_file_fsync', 'power cut')
    assert run == 6 and [c.n for c in failed] == [4, 5], failed  # renamed: certain, or not yet
    assert failed[-1].problems == ['neither the previous state nor the new one: out.txt neither '
                                   'old nor new'], failed  # empty: the data was never synced
    assert 'power cut after call 4 (replace out.txt)' in \
        fault_harness.describe('no_file_fsync', 'power cut', failed)


def test_a_power_cut_after_a_save_that_never_fsyncs_the_folder_loses_it(own_entries):
    assert fault_harness.results('no_folder_fsync', 'SIGKILL') == (5, [])
    run, failed = fault_harness.results('no_folder_fsync', 'power cut')
    assert run == 6 and [c.n for c in failed] == [5], failed  # only after it returned
    assert failed[0].problems == ['the entry point had returned, yet the new state did not '
                                  'outlive the power cut: out.txt old'], failed


def test_a_power_cut_after_a_rename_made_before_the_data_leaves_an_empty_file(own_entries):
    run, failed = fault_harness.results('rename_first', 'power cut')
    assert run == 7 and [c.n for c in failed] == [2, 3, 4], failed  # renamed, not yet synced
    assert all('out.txt neither old nor new' in c.problems[0] for c in failed), failed
    assert fault_harness.results('rename_first', 'power cut')[1] == failed  # made once


def test_a_power_cut_model_keeps_what_each_fsync_made_certain(own_entries):
    model = power_cut.Model(fault_harness.reference('atomic').recorder)
    assert model.points == 7 and model.pending(0) == []
    assert len(model.pending(5)) == 2  # the temporary made, then renamed: the folder not synced
    assert model.pending(6) == []  # the folder fsynced: all certain
    old, new = b'the previous text\n', b'the new text, longer\n'
    files = [{path: payload for path, kind, payload, _ in state if kind == 'file'}
             for state in model.states(5)]
    assert sorted(f['out.txt'] for f in files) == [new, new, old, old]  # each subset of two
    assert {f.get('out.txt.tmp-own') for f in files} == {None, new}

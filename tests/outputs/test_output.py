"""The output layer (``filesafety/output.py``, ``filesafety/lockfile.py``): its rules, and the findings they fix.

Every file the package writes goes through one layer: a file it did not write is never replaced,
truncated or deleted (its own are told by content), a write of several files is all or nothing
also under SIGKILL, a lock is created exclusively, and a results file is replaced only on request.
"""
import errno
import json
import os
import stat
import signal
import subprocess
import sys

import pytest

import gluon_multigpu as gm
from lab.studies import measure as lab_measure
from lab.studies import sweep as lab_sweep
from gluon_multigpu.filesafety import fs
from gluon_multigpu.filesafety import lockfile
from gluon_multigpu.filesafety import output
from conftest import load_script

BALANCE = ['--cpu-devices', '2', '--steps', '4', '--batch-size', '16', '--rounds', '1',
           '--scenarios', 'equal', '--every', '2']
BANDWIDTH = ['--cpu-devices', '2', '--quick', '--models', 'simple-cnn']


def one_line(capsys, *wanted):
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and all(w in err[0] for w in wanted), err
    assert 'Traceback' not in err[0]
    return err[0]


def not_measured(*args, **kwargs):
    raise AssertionError('measured: the run was not refused before its first measurement')


def snapshot(folder):
    """Every file under ``folder`` (hidden ones too) with its bytes; folders as None; a link as
    its target; anything else (a FIFO, socket, device) as its type, never opened (a FIFO's
    ``open`` would block)."""
    found = {}
    for root, dirs, names in os.walk(folder):
        for d in dirs:
            found[os.path.relpath(os.path.join(root, d), folder)] = None
        for n in names:
            path = os.path.join(root, n)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                found[os.path.relpath(path, folder)] = os.readlink(path)
            elif stat.S_ISREG(mode):
                with open(path, 'rb') as f:
                    found[os.path.relpath(path, folder)] = f.read()
            else:
                found[os.path.relpath(path, folder)] = ('special', stat.S_IFMT(mode))
    return found


def lock(path, say=None):
    return lockfile.Lock(path, held=lambda who: f'held{who}', fix='give another path', say=say)


def results_file(program, config, keys, status='complete', result=1):
    return {'format': lab_sweep.FORMAT, 'program': program, 'status': status,
            'total': len(keys), 'config': config,
            'done': [{'key': k, 'label': k, 'result': result, 'seconds': 1.0} for k in keys]}


# --- findings ------------------------------------------------------------------------------

def test_a_complete_results_file_is_not_replaced_by_a_run_with_other_settings(
        tmp_path, fashion_dir, monkeypatch, capsys):
    bandwidth = load_script('bandwidth')
    monkeypatch.setattr(lab_measure, 'measure_count', not_measured)
    two = tmp_path / 'two.json'
    two.write_text(json.dumps(results_file('bandwidth', {'seed': 0}, ['a', 'b', 'c', 'd'])))
    before = two.read_bytes()
    for other in (['--seed', '3'], ['--models', 'resnet18']):
        argv = [*BANDWIDTH, '--data-dir', str(fashion_dir), '--results', str(two), *other]
        assert bandwidth.main(argv) == 2
        one_line(capsys, str(two), 'complete run', '--resume', '--results', '--overwrite')
        assert two.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ['two.json']  # no lock file left


def test_overwrite_keeps_the_old_results_until_the_first_new_measurement(
        tmp_path, fashion_dir, monkeypatch, capsys):
    bandwidth = load_script('bandwidth')
    two = tmp_path / 'two.json'
    two.write_text(json.dumps(results_file('bandwidth', {'seed': 0}, ['a', 'b', 'c', 'd'])))
    before, seen = two.read_bytes(), []

    def measure_count(*args, **kwargs):
        seen.append(two.read_bytes())
        raise gm.GluonMultiGPUError('stopped in the first measurement')
    monkeypatch.setattr(lab_measure, 'measure_count', measure_count)
    argv = [*BANDWIDTH, '--data-dir', str(fashion_dir), '--results', str(two), '--seed', '3',
            '--overwrite']
    assert bandwidth.main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == 'error: stopped in the first measurement'
    assert seen == [before] and two.read_bytes() == before


def test_overwrite_replaces_the_results_with_the_first_measurement(tmp_path):
    path = tmp_path / 'r.json'
    path.write_text(json.dumps(results_file('p', {'a': 1}, ['x'])))
    units = [lab_sweep.Unit('y', 'y'), lab_sweep.Unit('z', 'z')]
    with pytest.raises(lab_sweep.SweepError, match='overwrite=True'):
        lab_sweep.Sweep(str(path), 'p', {'a': 2}, units, print)
    with lab_sweep.Sweep(str(path), 'p', {'a': 2}, units, print, overwrite=True, interval=0) as s:
        assert json.loads(path.read_text())['config'] == {'a': 1}
        s.begin(units[0])
        s.keep(units[0], 5)
    kept = json.loads(path.read_text())
    assert kept['config'] == {'a': 2} and kept['status'] == 'partial'
    # a file that is not a results file is never replaced, even with overwrite
    path.write_text('my notes')
    with pytest.raises(lab_sweep.SweepError, match='not a results file'):
        lab_sweep.Sweep(str(path), 'p', {'a': 2}, units, print, overwrite=True)
    assert path.read_text() == 'my notes'


def captured_sweep(monkeypatch, module, argv):
    """The config and unit keys the program's sweep has for ``argv`` (caught before loading)."""
    caught = {}

    def load(self, *args):
        caught.update(config=self.config, keys=[u.key for u in self.units])
        raise lab_sweep.SweepError('caught')
    with monkeypatch.context() as m:
        m.setattr(lab_sweep.Sweep, '_load', load)
        assert module.main(argv) == 2
    return caught


@pytest.mark.parametrize('script, argv', [
    ('bandwidth', [*BANDWIDTH, '--data-dir', '{data}']),
    ('balance', BALANCE),
    ('scaling', ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1',
                 '--num-train', '64', '--num-test', '32', '--data-dir', '{data}', '--out',
                 '{tmp}/out']),
    ('bfloat16', ['--models', 'simple-cnn', '--rounds', '1']),
])
@pytest.mark.parametrize('damage', ['text', {'unexpected': 1}, None])
def test_a_results_file_with_damaged_entries_is_one_line_on_resume(
        script, argv, damage, tmp_path, fashion_dir, monkeypatch, capsys):
    module = load_script(script)
    if script == 'bfloat16':
        from gluon_multigpu.features import precision
        monkeypatch.setattr(precision, 'check_bfloat16', lambda: None)
    results = tmp_path / 'r.json'
    argv = [a.format(data=fashion_dir, tmp=tmp_path) for a in argv] + ['--results', str(results)]
    caught = captured_sweep(monkeypatch, module, argv)
    capsys.readouterr()
    results.write_text(json.dumps(results_file(script, caught['config'], caught['keys'],
                                               result=damage)))
    before = results.read_bytes()
    monkeypatch.setattr(lab_sweep.Sweep, 'run', not_measured)
    assert module.main([*argv, '--resume']) == 2
    one_line(capsys, str(results), 'is damaged', '--overwrite')
    assert results.read_bytes() == before


def test_a_results_file_is_read_with_a_size_bound(tmp_path, monkeypatch, capsys):
    balance = load_script('balance')
    monkeypatch.setattr(balance, 'run_once', not_measured)
    big = tmp_path / 'r.json'
    with open(big, 'wb') as f:
        f.truncate(lab_sweep.RESULTS_LIMIT + 1)  # sparse: no disk used
    assert balance.main([*BALANCE, '--results', str(big), '--resume']) == 2
    one_line(capsys, str(big), 'larger than 64 MiB')


def test_a_failed_report_write_leaves_the_previous_report_byte_identical(
        tmp_path, monkeypatch, capsys):
    balance = load_script('balance')

    def run_once(args, scenario, split, devices, *rest, **kwargs):
        split.observe([0.01] * len(devices), [8] * len(devices))  # one timed step, as a run has
        return 1000.0
    monkeypatch.setattr(balance, 'run_once', run_once)
    out = tmp_path / 'out'
    assert balance.main([*BALANCE, '--out', str(out)]) == 0
    capsys.readouterr()
    assert {'report.md', 'balance.csv', 'images.png'} <= set(os.listdir(out))
    (out / 'report.md').unlink()
    (out / 'report.md').mkdir()  # planted where the report goes
    before = snapshot(out)
    assert balance.main([*BALANCE, '--out', str(out), '--resume']) == 2
    err = capsys.readouterr().err.splitlines()  # the resume notice, then the one-line error
    assert len(err) == 2 and err[0].startswith('resuming ') and 'Traceback' not in err[1], err
    assert 'report.md is a folder' in err[1] and 'nothing was replaced' in err[1], err
    assert snapshot(out) == before


def test_a_hard_link_or_a_users_file_at_a_lock_name_is_left_untouched(tmp_path):
    mine = tmp_path / 'mine.txt'
    mine.write_text('my notes')
    results = tmp_path / 'hl.json'
    for planted in ('link', 'file'):
        name = tmp_path / '.hl.json.lock'
        if planted == 'link':
            os.link(mine, name)
        else:
            name.write_text('my own file')
        with pytest.raises(lab_sweep.SweepError) as e:
            lab_sweep.Sweep(str(results), 'p', {}, [lab_sweep.Unit('a', 'a')], print)
        assert str(name) in str(e.value) and 'left as it is' in str(e.value)
        assert name.exists() and mine.read_text() == 'my notes'
        assert name.read_text() == ('my notes' if planted == 'link' else 'my own file')
        name.unlink()
    assert not results.exists()


def test_a_fifo_at_a_lock_name_is_refused_naming_it(tmp_path):
    name = tmp_path / '.r.json.lock'
    os.mkfifo(name)
    with pytest.raises(lab_sweep.SweepError) as e:
        lab_sweep.Sweep(str(tmp_path / 'r.json'), 'p', {}, [lab_sweep.Unit('a', 'a')], print)
    assert str(name) in str(e.value) and 'FIFO' in str(e.value)
    assert name.is_fifo()


def test_two_scaling_runs_on_one_out_folder_the_second_is_refused(
        tmp_path, fashion_dir, monkeypatch, capsys):
    scaling = load_script('scaling')
    monkeypatch.setattr(lab_sweep.Sweep, 'run', not_measured)
    monkeypatch.setattr(lab_measure, 'train_config', not_measured)
    out = tmp_path / 'out'
    first = lock(tmp_path / '.out.lock').acquire()  # the first run holds its --out
    try:
        argv = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1',
                '--num-train', '64', '--num-test', '32', '--data-dir', str(fashion_dir),
                '--out', str(out), '--results', str(tmp_path / 'elsewhere.json')]
        assert scaling.main(argv) == 2
        one_line(capsys, f'another run (process {os.getpid()})', str(out))
    finally:
        first.release()
    assert sorted(os.listdir(tmp_path)) == []


def test_a_users_file_at_the_checkpoint_lock_is_left_untouched(tmp_path):
    (tmp_path / '.lock').write_text('my notes')
    with pytest.raises(gm.errors.CheckpointError, match='left as it is'):
        with gm.Checkpointer(tmp_path, {'k': 1}):
            pass
    assert (tmp_path / '.lock').read_text() == 'my notes'


# --- the lock's rules ----------------------------------------------------------------------

def test_a_lock_is_created_with_its_marker_and_removed_on_release(tmp_path):
    path = tmp_path / 'x.lock'
    with lock(path) as held:
        assert held._fd is not None  # pylint: disable=protected-access
        text = path.read_text().splitlines()
        assert text[0] == lockfile.MARKER and text[1] == f'pid {os.getpid()}'
        with pytest.raises(gm.GluonMultiGPUError, match=f'held \\(process {os.getpid()}\\)'):
            lock(path).acquire()
    assert not path.exists()


@pytest.mark.parametrize('kind', ['folder', 'symlink', 'fifo', 'empty file'])
def test_a_lock_name_taken_by_something_else_is_refused_and_left(tmp_path, kind):
    path = tmp_path / 'x.lock'
    if kind == 'folder':
        path.mkdir()
    elif kind == 'symlink':
        (tmp_path / 'target').write_text('mine')
        path.symlink_to(tmp_path / 'target')
    elif kind == 'fifo':
        os.mkfifo(path)
    else:
        path.write_text('')
    before = snapshot(tmp_path)
    with pytest.raises(gm.GluonMultiGPUError) as e:
        lock(path).acquire()
    assert str(path) in str(e.value) and 'left as it is' in str(e.value)
    assert snapshot(tmp_path) == before


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_line(tmp_path):
    path = tmp_path / 'x.lock'
    path.write_text(f'{lockfile.MARKER}\npid 999999\nhost elsewhere\n')  # nobody holds its flock
    said = []
    with lock(path, say=said.append):
        assert f'pid {os.getpid()}' in path.read_text()
    assert len(said) == 1 and 'took over' in said[0] and 'process 999999' in said[0]
    assert not path.exists()


def test_a_checkpoints_stale_lock_is_taken_over_with_the_note_on_stderr(tmp_path, capsys):
    """A lock whose program gives no way to say things (the Checkpointer's) still says it: the
    takeover was silent there."""
    (tmp_path / gm.checkpoint.LOCK).write_text(f'{lockfile.MARKER}\npid 999999\nhost elsewhere\n')
    with gm.Checkpointer(tmp_path, {'k': 1}):
        pass
    err = capsys.readouterr().err
    assert f'note: took over the lock {tmp_path / gm.checkpoint.LOCK} of a run that ended ' \
        'without letting it go (process 999999)' in err, err


def test_a_stale_lock_with_a_second_name_is_not_taken_over(tmp_path):
    path = tmp_path / 'x.lock'
    path.write_text(f'{lockfile.MARKER}\npid 999999\n')
    os.link(path, tmp_path / 'kept')
    with pytest.raises(gm.GluonMultiGPUError, match='hard link'):
        lock(path).acquire()
    assert path.exists() and (tmp_path / 'kept').exists()


def test_release_leaves_a_file_that_took_the_locks_name_meanwhile(tmp_path):
    path = tmp_path / 'x.lock'
    held = lock(path).acquire()
    path.unlink()
    path.write_text('somebody else')
    held.release()
    assert path.read_text() == 'somebody else'


# --- single files ---------------------------------------------------------------------------

def test_atomic_write_goes_through_fs_and_leaves_no_temporary_on_a_failure(tmp_path, monkeypatch):
    path = tmp_path / 'a.txt'
    path.write_text('old')
    calls = []

    def hook(operation, where):
        calls.append(operation)
        if operation == 'fsync' and calls.count('fsync') == 1:  # the temporary's fsync
            raise OSError(errno.EIO, 'Input/output error')
    monkeypatch.setattr(fs, 'hook', hook)
    with pytest.raises(OSError) as e:
        with output.atomic_write(path) as f:
            f.write('new')
    assert e.value.filename == str(path)
    monkeypatch.setattr(fs, 'hook', None)
    assert calls[:3] == ['open', 'write', 'fsync']  # unnamed (O_TMPFILE) or named and removed
    assert os.listdir(tmp_path) == ['a.txt'] and path.read_text() == 'old'


# --- several files: all or nothing -----------------------------------------------------------

def write_report(folder, contents):
    with output.ReportSet(folder) as report:
        for name, text in contents.items():
            with open(report.path(name), 'w') as f:
                f.write(text)


OLD = {'a.md': 'old a', 'b.csv': 'old b'}
NEW = {'a.md': 'new a', 'b.csv': 'new b', 'c.png': 'new c'}


def as_bytes(contents):
    return {name: text.encode() for name, text in contents.items()}


def failing_move(folder, nth, code):
    """An ``fs.hook`` failing the ``nth`` move of a file into ``folder`` with ``code``."""
    moves = []

    def hook(operation, where):
        if operation == 'replace' and os.path.dirname(where) == str(folder):
            moves.append(where)
            if len(moves) == nth:
                raise OSError(code, os.strerror(code))
    return hook


def test_a_report_set_rolls_back_when_its_second_move_fails(tmp_path, monkeypatch):
    folder = tmp_path / 'out'
    write_report(folder, OLD)
    before = snapshot(folder)
    monkeypatch.setattr(fs, 'hook', failing_move(folder, 2, errno.ENOSPC))
    with pytest.raises(OSError) as e:
        write_report(folder, NEW)
    monkeypatch.setattr(fs, 'hook', None)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(folder / 'b.csv')
    assert snapshot(folder) == before  # a.md put back, no staging folder left


def test_a_report_set_removes_a_new_file_it_placed_when_a_later_move_fails(tmp_path,
                                                                          monkeypatch):
    folder = tmp_path / 'out'
    folder.mkdir()
    monkeypatch.setattr(fs, 'hook', failing_move(folder, 3, errno.EIO))
    with pytest.raises(OSError):
        write_report(folder, NEW)
    assert os.listdir(folder) == []


def count_calls(folder, contents):
    calls = []
    fs.hook = lambda operation, where: calls.append(operation)
    try:
        write_report(folder, contents)
    finally:
        fs.hook = None
    return len(calls)


def killed_at(folder, contents, n):
    """Write ``contents`` into ``folder`` in a child killed (SIGKILL) at its ``n``-th fs call."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no MXNet, only the write
        count = [0]

        def hook(operation, where):  # pylint: disable=unused-argument
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
        fs.hook = hook
        try:
            write_report(folder, contents)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_report_set_killed_at_any_call_is_old_or_new_after_recover(tmp_path):
    probe = tmp_path / 'probe'
    write_report(probe, OLD)
    total = count_calls(probe, NEW)
    assert total > 10
    outcomes = set()
    for n in range(1, total + 1):
        folder = tmp_path / f'run{n}'
        write_report(folder, OLD)
        old = snapshot(folder)
        assert killed_at(folder, NEW, n), n
        output.recover(str(folder))
        after = snapshot(folder)
        assert after in (old, as_bytes(NEW)), (n, after)
        outcomes.add('old' if after == old else 'new')
    assert outcomes == {'old', 'new'}  # the kill fell before and after the commit


def test_the_next_writer_of_a_folder_settles_what_a_killed_one_left(tmp_path):
    folder = tmp_path / 'out'
    write_report(folder, OLD)
    total = count_calls(tmp_path / 'probe', NEW)
    assert killed_at(folder, NEW, total - 3)  # after the commit: moves or clean-up left
    assert any(n.startswith('.report-') for n in os.listdir(folder))
    write_report(folder, {'d.txt': 'next'})
    assert snapshot(folder) == as_bytes(dict(NEW, **{'d.txt': 'next'}))


def test_recover_leaves_a_users_folder_with_a_staging_like_name(tmp_path):
    mine = tmp_path / '.report-12345678.tmp'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    (mine / '.journal.json').write_text('{"state": "committed", "files": []}')  # no marker
    before = snapshot(tmp_path)
    assert output.recover(str(tmp_path)) == []
    write_report(tmp_path, {'a.md': 'x'})
    assert snapshot(tmp_path) == dict(before, **{'a.md': b'x'})


# --- what a kill leaves: recognised by content ------------------------------------------------

def test_recover_removes_a_linked_temporary_only_if_its_content_has_the_hash_in_its_name(
        tmp_path):
    import hashlib
    data = b'{"runs": 1}'
    digest = hashlib.sha256(data).hexdigest()[:16]
    ours = tmp_path / f'.out.json.0123abcd.{digest}.tmp'
    ours.write_bytes(data)
    users = tmp_path / f'.notes.0123abcd.{digest}.tmp'
    users.write_bytes(b'the same name pattern, other content')
    assert output.recover(tmp_path) == [ours.name]
    assert sorted(os.listdir(tmp_path)) == [users.name]


def test_a_write_removes_what_a_killed_write_of_the_same_file_left(tmp_path):
    import hashlib
    data = b'old try'
    left = tmp_path / f'.a.txt.0123abcd.{hashlib.sha256(data).hexdigest()[:16]}.tmp'
    left.write_bytes(data)
    output.write_file(str(tmp_path / 'a.txt'), b'new')
    assert os.listdir(tmp_path) == ['a.txt']


def test_recover_removes_an_empty_staging_folder_and_keeps_a_non_empty_one(tmp_path):
    (tmp_path / '.report-0123abcd.tmp').mkdir()  # a kill before the journal was linked
    kept = tmp_path / '.report-89abcdef.tmp'
    kept.mkdir()
    (kept / 'notes').write_text('a user file')
    assert output.recover(tmp_path) == ['.report-0123abcd.tmp']
    assert os.listdir(tmp_path) == [kept.name] and (kept / 'notes').read_text() == 'a user file'


def test_the_writable_probe_names_no_file_where_unnamed_files_are_supported(tmp_path,
                                                                            monkeypatch):
    from gluon_multigpu.filesafety import targets
    opened = []
    monkeypatch.setattr(fs, 'hook', lambda operation, where: opened.append((operation, where)))
    targets.check_writable(str(tmp_path), '--out')
    monkeypatch.setattr(fs, 'hook', None)
    if hasattr(os, 'O_TMPFILE'):
        assert opened == [('open', str(tmp_path))]  # the folder itself: nothing was named
    assert os.listdir(tmp_path) == []


def test_a_folder_of_our_own_is_removed_through_fs_and_a_link_in_it_is_not_followed(
        tmp_path, monkeypatch):
    """``fs.remove_tree`` (a cluster's mkdtemp folder): every removal passes the hook, so a fault
    can be put there; a link inside is removed, what it leads to stays; a fault surfaces."""
    outside = tmp_path / 'user'
    outside.mkdir()
    (outside / 'keep.txt').write_text('theirs')
    ours = tmp_path / 'ours'
    (ours / 'bin').mkdir(parents=True)
    (ours / 'hosts').write_text('198.18.0.2\n')
    (ours / 'bin' / 'ssh').write_text('#!/bin/sh\n')
    (ours / 'to-user').symlink_to(outside)
    seen = []
    monkeypatch.setattr(fs, 'hook', lambda operation, path: seen.append((operation, path)))
    fs.remove_tree(ours)
    assert not ours.exists() and (outside / 'keep.txt').read_text() == 'theirs'
    assert sorted(seen) == sorted([('unlink', str(ours / 'hosts')),
                                   ('unlink', str(ours / 'bin' / 'ssh')),
                                   ('unlink', str(ours / 'to-user')), ('rmdir', str(ours / 'bin')),
                                   ('rmdir', str(ours))])

    (ours / 'bin').mkdir(parents=True)
    (ours / 'bin' / 'ssh').write_text('#!/bin/sh\n')

    def no_space(operation, path):
        if operation == 'rmdir':
            raise OSError(errno.ENOSPC, 'No space left on device', path)
    monkeypatch.setattr(fs, 'hook', no_space)
    with pytest.raises(OSError):
        fs.remove_tree(ours)
    assert (ours / 'bin').is_dir() and not (ours / 'bin' / 'ssh').exists()


def test_a_write_cut_short_by_a_file_size_limit_leaves_the_file_as_it_was(tmp_path):
    """``ulimit -f``: the kernel writes what fits, then refuses (EFBIG). An appended line is
    whole or absent: ``fs.write`` cuts the file back to its length before the write."""
    path = tmp_path / 'm.jsonl'
    child = ('import os, resource, sys\n'
             'from gluon_multigpu.filesafety import fs\n'
             'resource.setrlimit(resource.RLIMIT_FSIZE, (1050, 1050))\n'
             'fd = fs.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n'
             'line = b"%s\\n" % (b"x" * 99)\n'
             'try:\n'
             '    while True:\n'
             '        fs.write(fd, line, sys.argv[1])\n'
             'except OSError as e:\n'
             '    print(e.errno)\n')
    done = subprocess.run([sys.executable, '-c', child, str(path)], capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.split() == [str(errno.EFBIG)], done.stderr
    assert path.read_bytes() == (b'x' * 99 + b'\n') * 10  # the 11th line's 50 bytes cut off

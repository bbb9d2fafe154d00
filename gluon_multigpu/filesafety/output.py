"""The output layer: how the package writes files, in one place.

Every file the package writes (checkpoints, results files, reports, ``--json``, ``--plot``,
``--csv``, locks, the studies' and the launcher's outputs) follows the rules below, and every
change goes through ``filesafety/fs.py``, so that the fault-injection harness can fail or kill the
process at any call, or cut the power after it.

Notes
-----
1. It never replaces, truncates or deletes a file it did not write there. What is its own is
   recognised by its content (a lock's first line, a staging folder's journal, a results
   file's ``format``, a temporary's content hash), never by its name alone. The exception is a
   file the user names as an output (``--json out.json``, ``--results`` with ``--overwrite``):
   replaced at the user's request, through its symbolic links, and only if it is a regular file.
2. A file appears complete or not at all (``atomic_write``): written to a temporary file in the
   same folder (``O_TMPFILE``, unnamed while written; else an ``O_EXCL`` named one), fsynced,
   renamed over the name, and the folder fsynced. A complete temporary is linked as
   ``.NAME.<random>.<sha256 of content, 16 hex>.tmp``, which ``recover`` and the next write of
   NAME remove if the content matches.
3. A write of several files (``ReportSet``) is all or nothing, also when the process is killed:
   the new files are staged in a hidden folder ``.report-XXXXXXXX.tmp`` holding a journal
   (``JOURNAL``, marked ``STAGING_FORMAT``), each old file hard-linked into it as a backup; the
   commit is the journal replaced by a ``committed`` one; then the files move into place, and a
   failed move rolls back. ``recover(directory)`` (called by the next ``ReportSet`` there) rolls
   a committed staging folder forward and discards one that was not. The journal, then the
   staging folder's name, are fsynced before anything is staged, every staged file before the
   commit, and the folder again before its journal, removed last, goes.
4. A lock (``lockfile.Lock``) is created exclusively, its content fsynced before it is linked; a
   stale lock of a dead process is taken over with a line saying so.
5. A complete or partial results file is replaced only with ``--overwrite``.
6. Every file the package reads is opened without blocking, checked to be a regular file and
   read with a size bound (``filesafety/reading.py``).
"""
import contextlib
import errno
import json
import os
import re
import secrets
import stat

from ..errors import GluonMultiGPUError
from . import fs, reading
from .paths import resolve_output
from .atomic import (UNFINISHED as _UNFINISHED, _inode, _naming, atomic_write, create_exclusive,
                     create_whole, fsync_directory, fsync_path, makedirs, naming, new_folder,
                     remove_hashed, remove_own, write_file)

__all__ = ['atomic_write', 'naming', 'discard_unfinished', 'ReportSet',
           'recover', 'fsync_directory', 'create_exclusive', 'remove_own', 'write_file', 'makedirs',
           'replace_together', 'STAGING_FORMAT', 'JOURNAL']

#: The marker in a staging folder's journal: what makes such a folder the package's own.
STAGING_FORMAT = 'gluon-multigpu staging 1'
#: The journal's name in a staging folder.
JOURNAL = '.journal.json'
_STAGING_PREFIX, _STAGING_SUFFIX = '.report-', '.tmp'
_BACKUP = '.old-{}'
_STAGING_NAME = re.compile(r'^\.report-[0-9a-f]{8}\.tmp$')


def discard_unfinished():
    """Settle every temporary file and staging folder still being written (before ``os._exit``).

    A temporary file is removed (if still the one made); a staging folder is rolled forward if
    committed, else discarded (``recover``). What they would have replaced is left as it was, or
    the new set is complete. Called from the thread that ends the process, while the main thread
    may still be writing: that write fails, and the process ends.
    """
    for path, made in list(_UNFINISHED.items()):
        _UNFINISHED.pop(path, None)
        with contextlib.suppress(OSError, GluonMultiGPUError):
            if made is not None and os.path.isdir(path) and not os.path.islink(path):
                _settle(path)
            else:
                remove_own(path, made)


# -- several files, all or nothing ------------------------------------------------------------


def _read_journal(staging):
    """The journal of ``staging`` if the folder is one of ours (regular file with the marker)."""
    data = None  # unreadable, or not a regular file: not ours
    with contextlib.suppress(OSError, GluonMultiGPUError):
        data = reading.read_json(os.path.join(staging, JOURNAL), 1 << 20, 'journal',
                                 follow_links=False)
    if not isinstance(data, dict) or data.get('format') != STAGING_FORMAT or \
            data.get('state') not in ('staging', 'committed', 'rollback'):
        return None
    return data


def _write_journal(staging, journal):
    """Replace the journal of ``staging`` atomically (the commit point), fsynced."""
    write_file(os.path.join(staging, JOURNAL), json.dumps(journal).encode())
    fsync_directory(staging)


def _entries(journal):
    """``(name, staged inode, has backup)`` for each file of a committed journal."""
    for entry in journal.get('files', []):
        if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str) and \
                '/' not in entry[0] and entry[0] not in ('', '.', '..'):
            yield entry[0], (entry[1], entry[2]), bool(entry[3])


def _roll_back(staging, journal):
    directory = os.path.dirname(staging)
    for i, (name, made, backup) in enumerate(_entries(journal)):
        target = os.path.join(directory, name)
        old = os.path.join(staging, _BACKUP.format(i))
        if not backup:
            remove_own(target, tuple(made))  # a new file with no old one: only if still ours
        elif os.path.lexists(old) and _inode(target) != _inode(old):
            fs.replace(old, target)
    fsync_directory(directory)


def _settle(staging):
    """Finish what a writer of ``staging`` left: forward if committed, back if rolling back,
    else discard. Not ours (no journal with the marker): left untouched; returns False."""
    journal = _read_journal(staging)
    if journal is None:
        return False
    if journal['state'] == 'committed':  # roll forward: the staged files not yet moved
        directory = os.path.dirname(staging)
        for name, _, _ in _entries(journal):
            if os.path.lexists(os.path.join(staging, name)):
                fs.replace(os.path.join(staging, name), os.path.join(directory, name))
        fsync_directory(directory)
    elif journal['state'] == 'rollback':
        _roll_back(staging, journal)
    fs.remove_tree(staging, JOURNAL, fsync_directory)
    return True


def recover(directory):
    """Settle what a killed writer left in ``directory``; the names settled.

    Each hidden folder ``.report-*.tmp`` holding our journal is rolled forward (committed: the
    new set is completed) or discarded (not committed: the previous set was never touched), and
    removed; an EMPTY folder ``.report-XXXXXXXX.tmp`` (killed before its journal was linked, or
    at its last ``rmdir``) is removed with ``rmdir``, which cannot remove anything else. A
    temporary of ``write_file`` killed between its link and its rename is removed if its content
    has the hash its name carries (``atomic.remove_hashed``). Anything else, a user's folder or
    file with such a name included, is left as it is.
    """
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    settled = remove_hashed(directory)
    for name in names:
        path = os.path.join(directory, name)
        if name.startswith(_STAGING_PREFIX) and name.endswith(_STAGING_SUFFIX) and \
                os.path.isdir(path) and not os.path.islink(path):
            if _settle(path):
                settled.append(name)
            elif _STAGING_NAME.match(name):
                with contextlib.suppress(OSError):  # not empty: not ours, left
                    fs.rmdir(path)
                    settled.append(name)
    return settled


class ReportSet:
    """Write the files of a report into ``directory`` all or nothing (rule 3): a context manager.

    ``path(name)`` gives where to write the report's file ``name``: in the hidden staging folder,
    so that any function writing to a path will do. When the block ends without error, the set
    is committed and every staged file moved to its name; if a move fails, the files moved are
    put back from their backups (a new file that had no old one is removed): the folder is as it
    was. When the block fails, the staged files are removed, and ``directory`` too if this call
    created it and it is empty. A name held by a folder, device, pipe or socket is refused before
    anything is replaced (one line, ``GluonMultiGPUError``). An ``OSError`` names the report file
    being written (``filename``), not its staging name. Entering first settles what a killed
    writer left in ``directory`` (``recover``).
    """

    def __init__(self, directory):
        self.directory = os.path.abspath(os.fspath(directory))
        self._staging, self._made, self._names = None, [], []
        self._current = None  # the report file being written or moved

    def __enter__(self):
        try:
            with naming(self.directory):
                self._made = makedirs(self.directory)  # innermost first: the order to remove them
                recover(self.directory)
                self._staging = new_folder(lambda: os.path.join(
                    self.directory, f'{_STAGING_PREFIX}{secrets.token_hex(4)}{_STAGING_SUFFIX}'))
                create_whole(os.path.join(self._staging, JOURNAL), json.dumps(
                    {'format': STAGING_FORMAT, 'state': 'staging', 'pid': os.getpid()}).encode())
                # the journal, then the folder, durable before anything is staged
                fsync_directory(self._staging)
                fsync_directory(self.directory)
                _UNFINISHED[self._staging] = _inode(self._staging)
        except BaseException:
            if self._staging is not None:
                with contextlib.suppress(OSError):
                    fs.rmdir(self._staging)  # made just now, and empty (else left to recover)
            self._remove_made()
            raise
        return self

    def path(self, name):
        """Where to write the report's file ``name`` (staged until the block ends)."""
        if os.path.basename(name) != name or name in ('', '.', '..', JOURNAL) or \
                name.startswith('.old-'):
            raise ValueError(f'a report file is a plain name, not {name!r}')
        self._current = os.path.join(self.directory, name)
        self._names.append(name)
        return os.path.join(self._staging, name)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._discard()
            self._name(exc)
            return
        try:
            self._commit()
        except BaseException as e:
            self._name(e)
            raise

    def _entries(self):
        """The journal's entries, each name's old file checked (before anything is replaced) and
        its staged file fsynced (whoever wrote it: ssh-keygen does not fsync)."""
        entries = []
        for name in dict.fromkeys(self._names):
            self._current = target = os.path.join(self.directory, name)
            staged = os.lstat(os.path.join(self._staging, name))
            mode = None
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(target).st_mode
            if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                kind = 'a folder' if stat.S_ISDIR(mode) else 'a device, pipe or socket'
                raise GluonMultiGPUError(f'report folder {self.directory}: {name} is {kind}, not '
                                         'a file of a report; nothing was replaced: move it away '
                                         'or give another folder')
            fsync_path(os.path.join(self._staging, name), os.O_NOFOLLOW | os.O_NONBLOCK,
                       (errno.ELOOP,))  # a link is left as it is
            entries.append([name, staged.st_dev, staged.st_ino, mode is not None])
        return entries

    def _commit(self):
        try:
            entries = self._entries()
            for i, (name, _, _, has_old) in enumerate(entries):
                if has_old:  # a backup, until the new set is complete
                    self._current = os.path.join(self.directory, name)
                    fs.link(self._current, os.path.join(self._staging, _BACKUP.format(i)))
            journal = {'format': STAGING_FORMAT, 'state': 'committed', 'files': entries}
            _write_journal(self._staging, journal)
        except BaseException:
            self._discard()
            raise
        try:
            for name, _, _, _ in entries:
                self._current = os.path.join(self.directory, name)
                fs.replace(os.path.join(self._staging, name), self._current)
            fsync_directory(self.directory)
        except BaseException:  # a move failed: put the previous files back (the journal first)
            journal = dict(journal, state='rollback')
            with contextlib.suppress(OSError):  # rolled back all the same; a kill rolls forward
                _write_journal(self._staging, journal)
            try:
                _roll_back(self._staging, journal)
            finally:
                self._discard()
            raise
        self._finish()

    def _finish(self):
        """Remove the staging folder (tried twice: what a failure leaves, ``recover`` settles)."""
        for _ in range(2):
            with contextlib.suppress(OSError):
                if os.path.lexists(self._staging):
                    fs.remove_tree(self._staging, JOURNAL, fsync_directory)
                break
        _UNFINISHED.pop(self._staging, None)

    def _discard(self):
        """Remove what this call wrote: the staging folder, the folders made if empty."""
        self._finish()
        self._remove_made()

    def _name(self, error):
        """Make an ``OSError`` name the report file being written (raising a new one if it must)."""
        if isinstance(error, OSError) and self._current is not None:
            _naming(error, self._current)

    def _remove_made(self):
        for directory in self._made:
            try:
                fs.rmdir(directory)  # only while empty: nothing of anyone else's goes
            except OSError:
                return
        self._made = []


def replace_together(paths, write, limit=256 << 20):
    """Call ``write()``, which writes the files ``paths`` (outputs the user named, each through
    ``atomic_write``); if it fails, put back what each held before (a file it made is removed).

    For outputs in different folders (``--csv`` and ``--json``): both or neither, unless the
    process is killed between the two writes.
    """
    before = {}
    for target in (resolve_output(path, 'output') for path in paths):
        before[target] = (None, None)  # nothing there
        with contextlib.suppress(FileNotFoundError):
            before[target] = (reading.read_bytes(target, limit, 'output'), _inode(target))
    try:
        write()
    except BaseException:
        for target, (old, made) in before.items():
            now = _inode(target)
            if now != made and old is None:
                remove_own(target, now)  # made by ``write`` just now
            elif now != made:  # replaced: what it held, back
                write_file(target, old)
        raise

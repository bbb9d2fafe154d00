"""Writing files so that nothing half-written is ever left: atomic writes, JSON, CSV, checks.

Every output goes through ``atomic_write``: a temporary file in the target's
directory, flushed, fsynced and renamed, so a file appears complete or not at
all. The checks try out a directory before any work, so that a run never
fails at its end because an output cannot be written.
"""
import csv
import errno
import json
import os
import re
import shutil
import tempfile

from ..errors import GluonMultiGPUError

__all__ = ['atomic_write', 'write_json', 'write_csv', 'read_csv', 'check_writable',
           'check_output_dir', 'check_output_path', 'check_outputs', 'input_files',
           'resolve_output', 'is_checkpoint_folder']


class atomic_write:  # pylint: disable=invalid-name
    """Context manager writing ``path`` through a temporary file in the same directory.

    The file appears under its name only when the block ends without error
    (flushed, fsynced, renamed); otherwise nothing is left behind.

    With ``follow_links`` (outputs the user names), a symbolic link is written
    through: the file it leads to is replaced, beside itself, and the link
    stays (``resolve_output``). Without it (a checkpoint's own files), the
    rename replaces whatever has the name, a planted link included, and
    nothing outside the directory is touched. Either way only a regular file
    (or nothing) is ever replaced.
    """

    def __init__(self, path, mode='w', follow_links=True):
        self.path, self.mode = os.path.abspath(path), mode
        self.follow_links = follow_links
        self._tmp, self._file = None, None

    def __enter__(self):
        if self.follow_links:
            self.path = resolve_output(self.path, 'output')
            refused = os.path.lexists(self.path) and not os.path.isfile(self.path)
        else:
            refused = os.path.isdir(self.path) and not os.path.islink(self.path)
        if refused:
            raise IsADirectoryError(errno.EISDIR, 'not a regular file, not replaced', self.path)
        fd, self._tmp = tempfile.mkstemp(dir=os.path.dirname(self.path),
                                         prefix=f'.{os.path.basename(self.path)}.', suffix='.tmp')
        _UNFINISHED.add(self._tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        self._file = os.fdopen(fd, self.mode)
        return self._file

    def __exit__(self, exc_type, exc, tb):
        try:
            try:
                if exc_type is None:
                    self._file.flush()
                    os.fsync(self._file.fileno())
            finally:
                self._file.close()  # also on a full disk: the space is freed with the file
            if exc_type is None:
                os.replace(self._tmp, self.path)
        except OSError as e:
            if not e.filename:  # a full disk in flush(): name the file meant
                e.filename = self.path
            raise
        finally:
            _UNFINISHED.discard(self._tmp)
            if os.path.lexists(self._tmp):
                os.remove(self._tmp)
        if isinstance(exc, OSError) and not exc.filename:
            exc.filename = self.path  # a write in the block failed: name the file meant
        return False


def write_json(path, obj):
    """Write ``obj`` as indented JSON to ``path``, atomically."""
    with atomic_write(path, 'w') as f:
        json.dump(obj, f, indent=2)
        f.write('\n')


def write_csv(path, rows, columns):
    """Write ``rows`` (dicts) with ``columns`` as CSV, atomically; ``None`` becomes empty.

    Floats are written in full (Python's shortest exact form), so figures
    recomputed from the file match the ones computed here.
    """
    with atomic_write(path, 'w') as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction='ignore', lineterminator='\n')
        writer.writeheader()
        for r in rows:
            writer.writerow({k: '' if r.get(k) is None else r[k] for k in columns})


def read_csv(path):
    """Read a CSV written by ``write_csv``: numbers as int or float, empty fields as ``None``."""
    def value(text):
        if text == '':
            return None
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text
    with open(path, newline='') as f:
        return [{k: value(v) for k, v in r.items()} for r in csv.DictReader(f)]


#: Bytes ``atomic_write`` adds to a name for its temporary file (``.NAME.XXXXXXXX.tmp``).
TMP_EXTRA = len('..') + 8 + len('.tmp')


def _check_name(path, what):
    """Raise unless the file system takes ``path``'s name with room for its temporary name."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        limit = os.pathconf(directory if os.path.isdir(directory) else '/', 'PC_NAME_MAX')
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(name)) + TMP_EXTRA > limit:
        raise GluonMultiGPUError(f'{what} {path}: the name is {len(os.fsencode(name))} bytes long, '
                                 f'and this file system takes {limit - TMP_EXTRA} at most here; '
                                 'give a shorter name')


#: Trees of the kernel's own files: an output there, or a link leading there (``/dev/stdout``
#: is a link to ``/proc/self/fd/1``, a link to whatever standard output is), is never a file
#: a run may replace. (Devices in /dev are refused as not regular files; /dev/shm is a
#: file system like any other.)
SYSTEM_TREES = ('/proc', '/sys')
#: Links followed at most from an output's name to its file (the kernel's own limit).
MAX_LINKS = 40


def _under(path, trees):
    return any(path == t or path.startswith(t + os.sep) for t in trees)


def resolve_output(path, what):
    """Return the file an output named ``path`` is written to: its symbolic links followed.

    Each link is followed in turn, so that a chain through ``/proc`` or
    ``/sys`` is refused even where it ends at a regular file
    (``/dev/stdout`` with standard output redirected to a file: replacing
    that file would lose what the shell writes there). Raises
    ``GluonMultiGPUError`` naming ``what`` for such a path and for a loop.
    """
    current = os.path.abspath(path)
    for hop in range(MAX_LINKS):
        current = os.path.join(os.path.realpath(os.path.dirname(current)),
                               os.path.basename(current))
        # A plain name there is left to the writability check (nobody may create files there).
        if _under(current, SYSTEM_TREES) and (hop or os.path.islink(current)):
            via = '' if current == os.path.abspath(path) else f', which leads to {current},'
            raise GluonMultiGPUError(f'{what} {path}{via} is in {current.split(os.sep)[1]} '
                                     '(a device or a file of the kernel, not one a run may '
                                     'replace); give the name of a regular file')
        if not os.path.islink(current):
            return current
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    raise GluonMultiGPUError(f'{what} {path}: its symbolic links lead round in a loop; give the '
                             'name of a regular file')


def _check_not_empty(path, what):
    if path is None or not str(path).strip():
        raise GluonMultiGPUError(f'{what} is empty; give a path')


def _missing_directory(directory, what, path):
    """The error for an output whose ``directory`` is not a directory: what is wrong with it."""
    probe = directory
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if os.path.lexists(probe) and not os.path.isdir(probe):
        return GluonMultiGPUError(f'{what} {path}: {probe} is a file, not a directory; give a '
                                  'path in a directory')
    return GluonMultiGPUError(f'{what} {path}: directory {directory} does not exist; '
                              'create it first')


#: The name of a checkpoint's own files (``checkpoint.Checkpointer``).
CHECKPOINT_FILE = re.compile(r'ckpt-\d{6}\.(params|states)')
_CHECKPOINT_MARK = b'"format": "gluon-multigpu-checkpoint'


def is_checkpoint_folder(directory):
    """Whether ``directory`` holds a checkpoint: a checkpoint manifest or a checkpoint's files."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    if any(CHECKPOINT_FILE.fullmatch(n) for n in names):
        return True
    manifest = os.path.join(directory, 'manifest.json')
    if 'manifest.json' not in names or not os.path.isfile(manifest):
        return False
    try:
        with open(manifest, 'rb') as f:
            return _CHECKPOINT_MARK in f.read(4096)
    except OSError:
        return False


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_writable(directory, what):
    """Raise ``GluonMultiGPUError`` unless a file can be created in ``directory``.

    Tried out with a temporary file, created and removed: permission bits do
    not tell (root ignores them; /proc and /sys refuse new files to everyone).
    ``what`` names the option and path in the message.
    """
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix='.write-test.', suffix='.tmp'):
            pass
    except OSError as e:
        raise GluonMultiGPUError(f'{what}: cannot create files in {directory} ({e.strerror}); '
                                 'choose a writable directory') from None


def check_output_dir(directory, flag, checkpoints=False):
    """Raise ``GluonMultiGPUError`` unless ``directory`` is a writable directory or can be made.

    ``flag`` names the output in the message. ``checkpoints``: also refuse a
    directory that is, or is directly inside, a checkpoint folder (a report
    written there could take a checkpoint's names).
    """
    _check_not_empty(directory, flag)
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise GluonMultiGPUError(f'{flag} {directory} is a file; give a directory')
    _check_name(directory, flag)
    target = directory if os.path.isdir(directory) else os.path.dirname(directory)
    if not os.path.isdir(target):
        raise _missing_directory(target, flag, directory)
    check_writable(target, f'{flag} {directory}')
    if checkpoints:
        for d in (directory, os.path.dirname(directory)):
            if is_checkpoint_folder(d):
                raise GluonMultiGPUError(f'{flag} {directory} is in the checkpoint folder {d}; '
                                         'give a directory outside it')


def check_output_path(path, what, inputs=()):
    """Raise ``GluonMultiGPUError`` unless the file ``path`` can be written (check before any work).

    Returns the file that will be written: a symbolic link is written
    through (``resolve_output``). What is there must be a regular file: a
    device, pipe or socket would be replaced by a file. Also refused: one of
    ``inputs`` (the run's own input files), and a file in a checkpoint folder
    (its manifest or its files would be replaced). ``what`` names the output
    in the message.
    """
    _check_not_empty(path, what)
    target = resolve_output(path, what)
    directory = os.path.dirname(target)
    if os.path.isdir(target):
        raise GluonMultiGPUError(f'{what} {path} is a directory; give a file name')
    if os.path.lexists(target) and not os.path.isfile(target):
        raise GluonMultiGPUError(f'{what} {path} exists and is not a regular file (a device, '
                                 'pipe or socket); give the name of a file')
    _check_name(target, what)
    if not os.path.isdir(directory):
        raise _missing_directory(directory, what, path)
    check_writable(directory, f'{what} {path}')
    for source in inputs:
        if os.path.exists(target) and _same_file(target, source):
            same = os.path.abspath(path) == os.path.abspath(source)
            raise GluonMultiGPUError(f'{what} {path} is {"" if same else source + ", "}one of the '
                                     "run's input files; give another name")
    if is_checkpoint_folder(directory):
        raise GluonMultiGPUError(f'{what} {path} is in the checkpoint folder {directory}; give a '
                                 'path outside it')
    return target


def input_files(dataset, data_dir=None):
    """The files a run on data set ``dataset`` reads from ``data_dir`` (None: the data set's
    default folder): the ``inputs`` no output of the run may replace (``check_outputs``)."""
    from ..core.data import IDX_FILES, default_root  # pylint: disable=import-outside-toplevel
    root = data_dir or default_root(dataset)
    return [os.path.join(root, name) for name in IDX_FILES.values()]


def check_outputs(files=(), directories=(), checkpoint_dir=None, inputs=()):
    """Raise ``GluonMultiGPUError`` unless every output of a run can be written, each its own.

    ``files`` and ``directories`` are ``(what, path)`` pairs (None paths are
    skipped): files are checked by ``check_output_path`` against the run's
    ``inputs``, directories (reports) by ``check_output_dir`` outside any
    checkpoint folder; ``checkpoint_dir`` (the ``Checkpointer`` checks it
    itself) only must not collide. No two outputs may name the same place, or
    one lie inside another.
    """
    places = []
    for what, path in files:
        if path is not None:
            _check_not_empty(path, what)
            places.append((what, resolve_output(path, what)))
    for what, path in (*directories, ('`checkpoint_dir`', checkpoint_dir)):
        if path is not None:
            _check_not_empty(path, what)
            places.append((what, os.path.realpath(path)))
    for i, (what, path) in enumerate(places):
        for other, other_path in places[i + 1:]:
            if path == other_path or other_path.startswith(path + os.sep) or \
                    path.startswith(other_path + os.sep):
                raise GluonMultiGPUError(f'{what} and {other} name the same place ({path}); '
                                         'give each output its own path')
    for what, path in files:
        if path is not None:
            check_output_path(path, what, inputs)
    for what, path in directories:
        if path is not None:
            check_output_dir(path, what, checkpoints=True)


def _naming(error, path):
    """``error`` (an ``OSError``) naming ``path`` as its file: itself, or a new one of its kind.

    A rename's error names two files, and the second cannot be unset: such an
    error is replaced (``OSError`` picks the subclass its errno stands for).
    """
    if error.filename2 is None:
        error.filename = path
        return error
    return OSError(error.errno, error.strerror, path)


class naming:  # pylint: disable=invalid-name
    """Context manager: an ``OSError`` inside names ``path`` (``filename``), the file written.

    A write that fails on a full disk raises ``OSError`` without a file name,
    and one through a temporary file names the temporary; the user knows the
    file by the name they asked for.
    """

    def __init__(self, path):
        self.path = os.fspath(path)

    def __enter__(self):
        return self.path

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, OSError):
            named = _naming(exc, self.path)
            if named is not exc:
                raise named from exc
        return False


#: Temporary files and staging folders being written now: a process that must end at once
#: (a second Ctrl-C: ``os._exit``, which runs no ``finally``) removes them first.
_UNFINISHED = set()


def discard_unfinished():
    """Remove every temporary file and staging folder still being written (before ``os._exit``).

    What they would have replaced is left as it was; the outputs already in
    place stay. Called from the thread that ends the process, while the main
    thread may still be writing: that write fails, and the process ends.
    """
    for path in list(_UNFINISHED):
        _UNFINISHED.discard(path)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                pass


class ReportFolder:
    """Write the files of a report into ``directory`` all or nothing: a context manager.

    ``path(name)`` gives where to write the report's file ``name``: a hidden
    staging folder inside ``directory``, so that any function writing to a
    path will do. When the block ends without error, every staged file is
    moved to its name. When it fails (a disk that fills, an interruption),
    the staged files are removed, and ``directory`` too if this call created
    it: the folder is left as it was. Should a move fail, the files moved
    before it are removed as well: nothing this call wrote stays. An
    ``OSError`` names the report file being written (``filename``), not its
    staging name.
    """

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        self._staging, self._made, self._moved, self._names = None, [], [], []
        self._current = None  # the report file being written or moved

    def __enter__(self):
        missing, probe = [], os.path.abspath(self.directory)
        while not os.path.lexists(probe):
            missing.append(probe)  # innermost first: the order to remove them in
            probe = os.path.dirname(probe)
        self._made = missing
        try:
            with naming(self.directory):
                os.makedirs(self.directory, exist_ok=True)
                self._staging = tempfile.mkdtemp(dir=self.directory, prefix='.report-',
                                                 suffix='.tmp')
                _UNFINISHED.add(self._staging)
        except BaseException:
            self._remove_made()
            raise
        return self

    def path(self, name):
        """Where to write the report's file ``name`` (staged until the block ends)."""
        self._current = os.path.join(self.directory, name)
        self._names.append(name)
        return os.path.join(self._staging, name)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                for name in dict.fromkeys(self._names):
                    self._current = os.path.join(self.directory, name)
                    os.replace(os.path.join(self._staging, name), self._current)
                    self._moved.append(self._current)
            except BaseException as e:
                self._undo()
                named = self._named(e)
                if named is e:
                    raise
                raise named from e
            _UNFINISHED.discard(self._staging)
            shutil.rmtree(self._staging, ignore_errors=True)  # empty now
            return False
        self._undo()
        named = self._named(exc)
        if named is not exc:
            raise named from exc
        return False

    def _named(self, error):
        """``error``, naming the report file being written if it is an ``OSError``."""
        if isinstance(error, OSError) and self._current is not None:
            return _naming(error, self._current)
        return error

    def _undo(self):
        """Remove what this call wrote."""
        _UNFINISHED.discard(self._staging)
        shutil.rmtree(self._staging, ignore_errors=True)
        for path in self._moved:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        self._remove_made()

    def _remove_made(self):
        for directory in self._made:
            try:
                os.rmdir(directory)  # only while empty: nothing of anyone else's goes
            except OSError:
                return

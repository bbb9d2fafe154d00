"""Writing files so that nothing half-written is ever left: atomic writes, JSON, CSV, checks.

Every output goes through ``atomic_write``: a temporary file in the target's
directory, flushed, fsynced and renamed, so a file appears complete or not at
all. The checks try out a directory before any work, so that a run never
fails at its end because an output cannot be written.
"""
import csv
import json
import os
import tempfile

from .errors import GluonMultiGPUError

__all__ = ['atomic_write', 'write_json', 'write_csv', 'read_csv', 'check_writable',
           'check_output_dir', 'check_output_path']


class atomic_write:  # pylint: disable=invalid-name
    """Context manager writing ``path`` through a temporary file in the same directory.

    The file appears under its name only when the block ends without error
    (flushed, fsynced, renamed); otherwise nothing is left behind.
    """

    def __init__(self, path, mode='w'):
        self.path, self.mode = os.path.abspath(path), mode
        self._tmp, self._file = None, None

    def __enter__(self):
        fd, self._tmp = tempfile.mkstemp(dir=os.path.dirname(self.path),
                                         prefix=f'.{os.path.basename(self.path)}.', suffix='.tmp')
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        self._file = os.fdopen(fd, self.mode)
        return self._file

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
            if exc_type is None:
                os.replace(self._tmp, self.path)
        finally:
            if os.path.exists(self._tmp):
                os.remove(self._tmp)
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


def check_output_dir(directory, flag):
    """Raise ``GluonMultiGPUError`` unless ``directory`` is a writable directory or can be made.

    ``flag`` names the output in the message.
    """
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise GluonMultiGPUError(f'{flag} {directory} is a file; give a directory')
    _check_name(directory, flag)
    target = directory if os.path.isdir(directory) else os.path.dirname(directory)
    if not os.path.isdir(target):
        raise GluonMultiGPUError(f'{flag} {directory}: {target} does not exist; create it first')
    check_writable(target, f'{flag} {directory}')


def check_output_path(path, what):
    """Raise ``GluonMultiGPUError`` unless the file ``path`` can be written (check before any work).

    An existing path must be a regular file: writing replaces it (a device
    such as /dev/null, a pipe or a socket would be replaced by a file).
    ``what`` names the output in the message.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise GluonMultiGPUError(f'{what} {path} is a directory; give a file name')
    if os.path.lexists(path) and not os.path.isfile(path):
        raise GluonMultiGPUError(f'{what} {path} exists and is not a regular file (a device, '
                                 'pipe, socket or broken link); give the name of a file')
    _check_name(path, what)
    if not os.path.isdir(directory):
        raise GluonMultiGPUError(f'{what} {path}: directory {directory} does not exist; '
                                 'create it first')
    check_writable(directory, f'{what} {path}')

"""Checks made before any work: that every output of a run can be written, each its own.

The checks try out a directory before any work, so that a run never fails at
its end because an output cannot be written; ``resolve_output`` says which
file an output named by the user is written to (its symbolic links followed).
Nothing here changes a file but the probe of ``check_writable`` (created with
``O_EXCL`` and removed through ``fs``).
"""
import contextlib
import os
import re
import secrets

from ..errors import GluonMultiGPUError
from . import fs, reading
from .atomic import open_new
from .paths import check_default_output, check_name as _check_name, kind_of, resolve_output

__all__ = ['check_writable', 'check_output_dir', 'check_output_path', 'check_outputs',
           'check_default_output', 'resolve_output', 'is_checkpoint_folder', 'CHECKPOINT_FILE']


def _check_not_empty(path, what):
    if path is None or not str(path).strip():
        raise GluonMultiGPUError(f'{what} is empty; give a path')


def _check_place(name, directory, what, path):
    """Raise unless the file system takes ``name`` and files can be created in ``directory``
    (``what`` and ``path`` name the output): what is wrong with it, if it is not a directory."""
    _check_name(name, what)
    if not os.path.isdir(directory):
        probe = directory
        while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if os.path.lexists(probe) and not os.path.isdir(probe):
            raise GluonMultiGPUError(f'{what} {path}: {probe} is a file, not a directory; give a '
                                     'path in a directory')
        raise GluonMultiGPUError(f'{what} {path}: directory {directory} does not exist; create it '
                                 'first')
    check_writable(directory, f'{what} {path}')


#: The name of a checkpoint's own files (``checkpoint.Checkpointer``).
CHECKPOINT_FILE = re.compile(r'ckpt-\d{6}\.(params|states)')
_CHECKPOINT_MARK = b'"format": "gluon-multigpu-checkpoint'


def is_checkpoint_folder(directory):
    """Whether ``directory`` holds a checkpoint: a checkpoint manifest or a checkpoint's files."""
    with contextlib.suppress(OSError, GluonMultiGPUError):
        if any(CHECKPOINT_FILE.fullmatch(n) for n in os.listdir(directory)):
            return True
        with reading.open_regular(os.path.join(directory, 'manifest.json'), 'manifest') as f:
            return _CHECKPOINT_MARK in f.read(4096)  # a regular file (or a link to one) only
    return False


def _same_file(a, b):
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def check_writable(directory, what):
    """Raise ``GluonMultiGPUError`` unless a file can be created in ``directory``.

    Tried out with a file without a name (``O_TMPFILE``: a kill leaves nothing), or where the
    file system does not support that, a named temporary file, created and removed: permission
    bits do not tell (root ignores them; /proc and /sys refuse new files to everyone).
    ``what`` names the option and path in the message.
    """
    try:
        probe = os.path.join(directory, f'.write-test.{secrets.token_hex(4)}.tmp')
        fd, named = open_new(probe, 0o600)
        os.close(fd)
        if named:
            fs.unlink(probe)  # created just now, exclusively: ours
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
        kind = kind_of(directory)
        kind = kind if kind == 'a file' else f'{kind}, not a directory'
        raise GluonMultiGPUError(f'{flag} {directory} is {kind}; give a directory')
    target = directory if os.path.isdir(directory) else os.path.dirname(directory)
    _check_place(directory, target, flag, directory)
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
        raise GluonMultiGPUError(f'{what} {path} exists and is not a regular file '
                                 f'({kind_of(target) or "a link to nothing"}); give the name of a '
                                 'file')
    _check_place(target, directory, what, path)
    for source in inputs:
        if os.path.exists(target) and _same_file(target, source):
            same = os.path.abspath(path) == os.path.abspath(source)
            raise GluonMultiGPUError(f'{what} {path} is {"" if same else source + ", "}one of the '
                                     "run's input files; give another name")
    if is_checkpoint_folder(directory):
        raise GluonMultiGPUError(f'{what} {path} is in the checkpoint folder {directory}; give a '
                                 'path outside it')
    return target


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
    for i, (what, path) in enumerate((*files, *directories, ('`checkpoint_dir`', checkpoint_dir))):
        if path is not None:  # a file where its links lead, a folder where it really is
            _check_not_empty(path, what)
            places.append((what, resolve_output(path, what) if i < len(files) else
                           os.path.realpath(path)))
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

"""Where an output named by the user is written: its name checked, its symbolic links followed.

The ground floor of the file layer: ``atomic`` resolves every output through
``resolve_output``, and the pre-run checks (``filesafety.targets``) use both.
"""
import contextlib
import os
import stat

from . import reading
from ..errors import GluonMultiGPUError

__all__ = ['TMP_EXTRA', 'check_name', 'resolve_output', 'check_default_output', 'kind_of',
           'check_argument', 'SYSTEM_TREES', 'MAX_LINKS']


#: Bytes ``atomic_write`` adds to a name for its temporary file (``.NAME.XXXXXXXX.tmp``).
TMP_EXTRA = len('..') + 8 + len('.tmp')


def check_name(path, what):
    """Raise unless the file system takes ``path``'s name with room for its temporary name."""
    directory, name = os.path.split(os.path.abspath(path))
    limit = 255  # where the file system does not say
    with contextlib.suppress(OSError, ValueError):
        limit = os.pathconf(directory if os.path.isdir(directory) else '/', 'PC_NAME_MAX')
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


def check_default_output(path, what, marker, fix):
    """Return the file an output the user did not name (a default, ``path``) is written to;
    raise ``GluonMultiGPUError`` naming ``what`` if something there is not the package's own:
    a regular file whose content begins with ``marker`` (bytes). A default never replaces what
    the package did not write (``filesafety.output``, rule 1); ``fix`` says what to do instead."""
    target = resolve_output(path, what)
    if not os.path.lexists(target) or \
            reading.read_if_regular(target, lambda f: f.read(len(marker))) == marker:
        return target
    raise GluonMultiGPUError(f'{what} {path} holds a file that gluon-multigpu did not write; it '
                             f'is left as it is: {fix}')


def kind_of(path):
    """What ``path`` is, in words, its links followed (``'a file'``, ``'a folder'``, ``'a FIFO
    (a named pipe)'``, ``'a socket'``, ``'a device'``; None if nothing is there)."""
    with contextlib.suppress(OSError):
        mode = os.stat(path).st_mode
        return ('a file' if stat.S_ISREG(mode) else 'a folder' if stat.S_ISDIR(mode) else
                'a FIFO (a named pipe)' if stat.S_ISFIFO(mode) else
                'a socket' if stat.S_ISSOCK(mode) else 'a device')
    return None


def check_argument(value, name, folder):
    """Return ``value``, a path argument of the library, as an absolute path, or raise naming the
    argument ``name`` (in backquotes).

    ``folder``: a folder (made if missing, its parent must exist); else a file name.
    """
    kind = 'a folder' if folder else 'a file name'
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise GluonMultiGPUError(f'`{name}` is {type(value).__name__}: give {kind} (a str or a '
                                 'path)')
    if not path.strip():
        raise GluonMultiGPUError(f'`{name}` is an empty path; give {kind}')
    if folder:
        if os.path.exists(path) and not os.path.isdir(path):
            kind = kind_of(path)
            kind += '' if kind == 'a file' else ', not a folder'
            raise GluonMultiGPUError(f'`{name}` {path} is {kind}; give a folder')
        parent = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    else:
        if os.path.isdir(path):
            raise GluonMultiGPUError(f'`{name}` {path} is a directory; give a file name')
        parent = os.path.dirname(resolve_output(path, f'`{name}`'))
    if not os.path.isdir(parent):
        raise GluonMultiGPUError(f'`{name}` {path}: directory {parent} does not exist; create it '
                                 'first')
    return os.path.abspath(path)

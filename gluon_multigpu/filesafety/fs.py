"""The file-system calls through which the package changes files: one place, so that a fault can be
put into any of them.

Every change the package makes on disk (``output`` and whatever writes through it) is one of
these calls: ``open`` (to create), ``write``, ``fsync``, ``replace``, ``link`` (also
``link_unnamed``, which names an ``O_TMPFILE`` file), ``unlink``,
``mkdir``, ``rmdir`` (``remove_tree`` is made of ``unlink`` and ``rmdir``). A writer that is not
Python's (MXNet's ``save_parameters``) announces its write with ``external`` before it starts.
Each call first passes its name and path to ``hook`` (None but in tests): the fault-injection
harness (``tests/outputs/test_fault_harness.py``) sets it to count the calls of an entry point,
then to fail the n-th (``ENOSPC``, ``EIO``, ``EFBIG`` after half a write) or to kill the
process there (SIGKILL). ``trace`` (tests only) also gets the file descriptor of a ``write``, ``fsync`` or ``link_unnamed``: the harness's
power-cut model learns from it which file or folder an fsync makes durable.
"""
import contextlib
import ctypes
import errno
import fcntl
import os
import stat

__all__ = ['hook', 'trace', 'open', 'write', 'fsync', 'replace', 'link', 'link_unnamed', 'unlink',
           'mkdir', 'rmdir', 'remove_tree', 'external']

#: Called as ``hook(operation, path)`` before each call (``operation``: ``'open'``, ``'write'``,
#: ``'fsync'``, ``'replace'``, ``'link'``, ``'unlink'``, ``'mkdir'`` or ``'rmdir'``); it may
#: raise ``OSError`` (or end the process) to stand for a fault there. Tests only.
hook = None
#: Called as ``trace(operation, path, fd)`` after ``hook`` (``fd``: the file descriptor of a
#: ``write``, ``fsync`` or ``link_unnamed``, else None). Tests only.
trace = None


def _before(operation, path, fd=None):
    if hook is not None:
        hook(operation, os.fspath(path))
    if trace is not None:
        trace(operation, os.fspath(path), fd)


def open(path, flags, mode=0o666):  # pylint: disable=redefined-builtin
    """``os.open`` (a file created or opened for writing)."""
    _before('open', path)
    return os.open(path, flags, mode)


def write(fd, data, path=''):
    """Write all of ``data`` (bytes) to ``fd``, or none of it: a write at the end of a regular
    file that fails part way (a full disk, a file-size limit: ``ulimit -f``) cuts the file back
    to its length before, then raises. ``path`` names the file for the hook."""
    view, info = memoryview(data), os.fstat(fd)
    at_end = stat.S_ISREG(info.st_mode) and (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND or
                                              os.lseek(fd, 0, os.SEEK_CUR) == info.st_size)
    end = info.st_size if at_end else None  # the length to cut a failed write back to
    while view:
        try:
            _before('write', path, fd)
            view = view[os.write(fd, view):]
        except OSError:
            if end is not None and len(view) < len(data):
                os.ftruncate(fd, end)
                os.lseek(fd, end, os.SEEK_SET)
            raise


def fsync(fd, path=''):
    """``os.fsync``; ``path`` names the file (or folder) for the hook."""
    _before('fsync', path, fd)
    os.fsync(fd)


def replace(source, target):
    """``os.replace``: ``source`` takes the name ``target``, atomically."""
    _before('replace', target)
    os.replace(source, target)


def link(source, target):
    """``os.link``: a hard link ``target`` to ``source`` (fails if ``target`` exists); a symbolic
    link ``source`` is itself linked, not followed."""
    _before('link', target)
    os.link(source, target, follow_symlinks=False)


def link_unnamed(fd, target):
    """Give the unnamed file ``fd`` (``O_TMPFILE``) the name ``target`` (fails if it exists).

    Through ``linkat`` following ``/proc/self/fd/N`` (a plain ``link``, which Python uses
    unless given a folder descriptor, would link the symbolic link itself: EXDEV), else
    ``linkat`` with ``AT_EMPTY_PATH`` (where /proc refuses). Hooked as ``link``.
    """
    _before('link', target, fd)
    root = os.open('/', os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(f'/proc/self/fd/{fd}', target, src_dir_fd=root, follow_symlinks=True)
        return
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.ENOENT, errno.EPERM):
            raise
        first = e
    finally:
        os.close(root)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.linkat(fd, b'', _AT_FDCWD, os.fsencode(target), _AT_EMPTY_PATH) != 0:
        raise first


_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000


def unlink(path, missing_ok=False):
    """``os.unlink``; with ``missing_ok``, a name already gone is no error."""
    _before('unlink', path)
    with contextlib.suppress(*((FileNotFoundError,) if missing_ok else ())):
        os.unlink(path)


def mkdir(path, mode=0o777):
    """``os.mkdir``."""
    _before('mkdir', path)
    os.mkdir(path, mode)


def rmdir(path):
    """``os.rmdir`` (an empty folder)."""
    _before('rmdir', path)
    os.rmdir(path)


def remove_tree(path, last=None, settle=None):
    """Remove a folder the package made for itself alone (``mkdtemp``, a staging or save folder)
    and all it holds.

    Bottom up, each removal one ``unlink`` or ``rmdir`` call through the hook; a symbolic link is
    removed, never followed. The first failure raises, with what was not reached left in place.
    ``last`` names the file in ``path`` that makes the folder the package's (a journal, a
    marker): it goes after all else, once ``settle(path)``, if given, made those removals
    durable.
    """
    path = os.fspath(path)
    for folder, dirs, files in os.walk(path, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            if (folder, name) != (path, last):
                unlink(os.path.join(folder, name))
        if folder != path:
            rmdir(folder)
    if last is not None and os.path.lexists(os.path.join(path, last)):
        if settle is not None:
            settle(path)  # the removals durable first: a power cut keeps them in order
        unlink(os.path.join(path, last))  # last: until here the folder is recognised
    rmdir(path)


def external(path):
    """Announce a write to ``path`` by code outside Python (MXNet's ``save_parameters``)."""
    _before('write', path)

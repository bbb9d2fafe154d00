"""Single files written whole or not at all: the first half of the output layer (``output``).

Its rules are stated once, in ``output``'s docstring; what is here: ``atomic_write`` (a file
through a temporary file, unnamed (``O_TMPFILE``) until complete, then named by its content's
hash, or ``O_EXCL`` where that is not supported; fsynced, renamed, the folder fsynced;
``remove_hashed`` removes what a kill left), ``create_whole`` (a new file linked whole),
``create_exclusive`` (a new file, never one opened on an existing name), ``remove_own`` (a file
removed only while it is still the one made here), ``naming`` (an ``OSError`` naming the file the
user knows). Every change goes through ``fs``.
"""
import contextlib
import errno
import hashlib
import io
import os
import re
import secrets
import stat

from . import fs, reading
from .paths import resolve_output

__all__ = ['atomic_write', 'write_file', 'naming', 'fsync_directory', 'fsync_path',
           'create_exclusive', 'remove_own', 'makedirs', 'UNFINISHED', 'open_unnamed',
           'create_whole', 'remove_hashed', 'HASHED', 'new_folder', 'open_new']

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

#: Temporary files and staging folders being written now, with the inode that makes each ours:
#: a process that must end at once (``os._exit``, which runs no ``finally``) settles them first.
UNFINISHED = {}


def _inode(path):
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        return st.st_dev, st.st_ino
    return None


def fsync_path(path, flags=os.O_NONBLOCK, quiet=()):
    """fsync the file or folder ``path``, opened for reading with ``flags`` added; an ``OSError``
    whose errno is in ``quiet`` (any, with ``quiet=True``) is no error."""
    try:
        fd = os.open(path or '.', os.O_RDONLY | os.O_CLOEXEC | flags)
        try:
            fs.fsync(fd, path)
        finally:
            os.close(fd)
    except OSError as e:
        if quiet is not True and e.errno not in quiet:
            raise


def fsync_directory(directory):
    """fsync ``directory``, so that a rename in it outlives a power cut (best effort: some file
    systems refuse it; the rename is done)."""
    fsync_path(directory, os.O_DIRECTORY, quiet=True)


def create_exclusive(path, data, mode=0o666, unfinished=False):
    """Create the new file ``path`` holding ``data`` (bytes, or an iterable of bytes chunks),
    fsynced; raise if anything has the name (``FileExistsError``). On failure the file made here
    is removed; with ``unfinished``, it is registered meanwhile for ``discard_unfinished``."""
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    fd = fs.open(path, _FLAGS, mode)
    made = _inode(path)
    if unfinished:
        UNFINISHED[path] = made
    try:
        for chunk in chunks:
            fs.write(fd, chunk, path)
        fs.fsync(fd, path)
    except BaseException:
        UNFINISHED.pop(path, None)
        remove_own(path, made)
        raise
    finally:
        os.close(fd)
    return made


def remove_own(path, inode):
    """Remove ``path`` only if it is still the file ``inode`` (``(st_dev, st_ino)``) made here."""
    if inode is not None and _inode(path) == inode:
        fs.unlink(path, missing_ok=True)


@contextlib.contextmanager
def atomic_write(path, mode='w', follow_links=True):
    """Context manager writing ``path`` through a temporary file in the same directory.

    Yields a file object (text for ``'w'``, bytes for ``'wb'``) that collects the content; when
    the block ends without error it is written to a new temporary file (``O_EXCL``), fsynced,
    renamed over ``path``, and the folder fsynced; otherwise nothing is left behind.

    With ``follow_links`` (outputs the user names), a symbolic link is written through: the file
    it leads to is replaced, beside itself, and the link stays (``resolve_output``). Without it
    (a checkpoint's own files), the rename replaces whatever has the name, a planted link
    included, and nothing outside the directory is touched. Either way only a regular file (or
    nothing) is ever replaced. An ``OSError`` names ``path``.
    """
    if mode not in ('w', 'wb'):
        raise ValueError(f"atomic_write writes with mode 'w' or 'wb', not {mode!r}")
    path = os.path.abspath(path)  # as messages name it
    path = resolve_output(path, 'output') if follow_links else path
    _check_target(path, follow_links)
    buffer = io.StringIO() if mode == 'w' else io.BytesIO()
    try:
        yield buffer
    except OSError as e:
        if not e.filename:
            e.filename = path  # a write in the block failed: name the file meant
        raise
    with naming(path):
        _check_target(path, follow_links)
        write_file(path, buffer.getvalue().encode('utf-8') if mode == 'w' else buffer.getvalue())


def _check_target(path, follow_links):
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode) or (follow_links and not stat.S_ISREG(mode)):
        raise IsADirectoryError(21, 'not a regular file, not replaced', path)


#: A linked temporary's name: ``.NAME.<8 random hex digits>.<first 16 hex digits of
#: sha256(content)>.tmp`` (the random part: two writers of one content never collide).
HASHED = re.compile(r'^\.(.+)\.[0-9a-f]{8}\.([0-9a-f]{16})\.tmp$')
#: Errors of an ``O_TMPFILE`` open that mean "not supported here" (fall back to a named file).
_NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)


def open_unnamed(directory, mode=0o666):
    """A new file without a name in ``directory`` (``O_TMPFILE``), open for writing; None where
    the file system (or /proc, needed to link it) does not support that. A kill before it is
    linked leaves nothing."""
    if not hasattr(os, 'O_TMPFILE') or not os.path.isdir('/proc/self/fd'):
        return None
    try:
        return fs.open(directory or '.', os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in _NO_TMPFILE:
            return None
        raise


def open_new(path, mode, flags=_FLAGS):
    """A new file for ``path``, open for writing: ``(fd, named)``. Unnamed in its folder
    (``open_unnamed``; ``named`` False: nothing has the name yet), else created at ``path`` with
    ``flags`` (``O_EXCL``: ``FileExistsError`` if anything has the name; ``named`` True)."""
    fd = open_unnamed(os.path.dirname(path), mode)
    return (fs.open(path, flags, mode), True) if fd is None else (fd, False)


#: Errors of linking an unnamed file that mean "cannot be linked here" (fall back).
_NO_LINK = (errno.EXDEV, errno.ENOENT, errno.EPERM)


def remove_hashed(directory, target=None):
    """Remove the linked temporaries a killed ``write_file`` left in ``directory`` (only those
    for the file named ``target``, if given): each a regular file named ``.NAME.<random>.<hash>
    .tmp`` whose content has that hash (rule 1: recognised by content; a file with such a name
    and other content is left). Returns their names."""
    names = []  # no folder there, or not one that can be read: nothing to remove
    with contextlib.suppress(OSError):
        names = os.listdir(directory or '.')
    removed = []
    for name in names:
        match = HASHED.match(name)
        path = os.path.join(directory, name)
        if match and target in (None, match.group(1)) and \
                reading.read_if_regular(path, lambda f: reading.sha256(f)[:16]) == match.group(2):
            with contextlib.suppress(FileNotFoundError):
                fs.unlink(path)
                removed.append(name)
    return removed


def write_file(path, data, check=None, mode=0o666):
    """Write ``data`` (bytes, or an iterable of bytes chunks) to ``path`` atomically (rule 2);
    ``check(temporary path)``, if given, runs on the complete file before the rename (an error
    there leaves nothing); ``mode``: the new file's permissions (less the umask).

    The temporary is unnamed (``O_TMPFILE``) until written and fsynced, then linked as
    ``.NAME.<random>.<hash of content>.tmp`` and renamed over ``path``: a kill in between leaves
    a file that ``remove_hashed`` (run here first, and by ``output.recover``) knows by its
    content. Where ``O_TMPFILE`` is not supported (or the link is refused), an ``O_EXCL`` named
    temporary. Either way it is removed on any failure, and registered meanwhile for
    ``discard_unfinished``.
    """
    directory, name = os.path.split(path)
    remove_hashed(directory, name)  # what a killed write of this file left
    base = os.path.join(directory, f'.{name}.{secrets.token_hex(4)}')
    tmp = _link_unnamed(path, data, mode, lambda digest: f'{base}.{digest[:16]}.tmp',
                        lambda chunks: _write_named(f'{base}.tmp', chunks, mode))
    made = UNFINISHED[tmp] = _inode(tmp)  # complete and ours: checked and renamed, else removed
    try:
        if check is not None:
            check(tmp)
        fs.replace(tmp, path)
        made = None
    finally:
        UNFINISHED.pop(tmp, None)
        remove_own(tmp, made)
    fsync_directory(directory)


def _link_unnamed(path, data, mode, name, otherwise):
    """Write ``data`` (bytes or chunks) to an unnamed file beside ``path``, fsync it and link it
    as ``name(its sha256 in hex)``; return that name. Where ``O_TMPFILE`` is not supported (or
    the link is refused): what ``otherwise(the chunks)`` returns, which writes them instead."""
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    fd = open_unnamed(os.path.dirname(path), mode)
    if fd is None:
        return otherwise(chunks)
    digest = hashlib.sha256()
    try:
        for chunk in chunks:
            digest.update(chunk)
            fs.write(fd, chunk, path)
        fs.fsync(fd, path)
        linked = name(digest.hexdigest())
        try:
            fs.link_unnamed(fd, linked)
        except OSError as e:
            if e.errno not in _NO_LINK:
                raise
            os.lseek(fd, 0, os.SEEK_SET)  # nothing was named: copy it to a named file
            return otherwise(iter(lambda: os.read(fd, 1 << 20), b''))
    finally:
        os.close(fd)
    return linked


def _write_named(tmp, chunks, mode):
    """``write_file``'s temporary ``tmp``, named and ``O_EXCL`` (no ``O_TMPFILE`` here)."""
    create_exclusive(tmp, chunks, mode, unfinished=True)
    return tmp


def create_whole(path, data):
    """Create the new file ``path`` holding ``data`` (bytes), fsynced, all or nothing: written
    unnamed and then linked where ``O_TMPFILE`` is supported (a kill leaves nothing, or the
    whole file), else ``create_exclusive``. Raises ``FileExistsError`` if anything has the name."""
    _link_unnamed(path, data, 0o666, lambda digest: path,
                  lambda chunks: create_exclusive(path, b''.join(chunks)))


def _naming(error, path):
    """Make ``error`` (an ``OSError``) name ``path`` as its file: itself, or raise a new one of its
    kind from it.

    A rename's error names two files, and the second cannot be unset: such an error is replaced
    (``OSError`` picks the subclass its errno stands for).
    """
    if error.filename2 is not None:
        raise OSError(error.errno, error.strerror, path) from error
    error.filename = path


@contextlib.contextmanager
def naming(path):
    """Context manager: an ``OSError`` inside names ``path`` (``filename``), the file written.

    A write that fails on a full disk raises ``OSError`` without a file name, and one through a
    temporary file names the temporary; the user knows the file by the name they asked for.
    """
    path = os.fspath(path)
    try:
        yield path
    except OSError as e:
        _naming(e, path)
        raise


def new_folder(name):
    """Make a new folder (mode 0700) at ``name()``, a random name drawn again while one is
    taken; return its path."""
    while True:
        path = name()
        with contextlib.suppress(FileExistsError):
            fs.mkdir(path, 0o700)
            return path


def makedirs(path, mode=0o777):
    """``os.makedirs(path, exist_ok=True)`` through ``fs.mkdir``; returns the folders made,
    innermost first (the order to remove them in)."""
    missing, probe = [], os.path.abspath(path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        missing.append(probe)
        probe = os.path.dirname(probe)
    for folder in reversed(missing):
        try:
            fs.mkdir(folder, mode)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
    return missing

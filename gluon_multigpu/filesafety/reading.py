"""Reading the files a run is given, so that no input can block it or exhaust its memory.

Every file the package reads (host files, results files, manifests, checkpoints' records, the
data's headers) goes through ``open_regular``: opened without blocking (a FIFO put where a file
was expected would otherwise wait for a writer for ever), then checked to be a regular file on
the open descriptor, so that nothing can be swapped in between check and read; and read with a
size bound (``read_bytes``), so that a 1 GB file where a 1 kB one belongs is one line, not a
process that runs out of memory.
"""
import errno
import hashlib
import json
import os
import stat

from ..errors import GluonMultiGPUError

__all__ = ['open_file', 'open_regular', 'read_if_regular', 'read_bytes', 'read_text', 'read_json',
           'size_text', 'sha256']


def size_text(num_bytes):
    """``num_bytes`` as ``64 MiB``, ``12 KiB`` or ``300 bytes``."""
    for unit, scale in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if num_bytes >= scale:
            return f'{num_bytes / scale:.3g} {unit}'
    return f'{num_bytes} bytes'


def open_file(path, follow_links):
    """Open ``path`` for reading in binary, or raise ``OSError``: ``open_regular`` with the error
    as it is (``IsADirectoryError`` for anything but a regular file, its ``strerror`` what it
    is), for callers that say in their own words what is wrong."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, 'a directory' if stat.S_ISDIR(mode) else
                                'not a regular file (a pipe, socket or device)', path)
    os.set_blocking(fd, True)
    return os.fdopen(fd, 'rb')


def open_regular(path, what, follow_links=True):
    """Open ``path`` for reading in binary, or raise ``GluonMultiGPUError`` naming ``what``.

    Raises ``FileNotFoundError`` (unchanged) when nothing has the name, so that callers can
    treat a missing file as they choose. Anything but a regular file (a folder, FIFO, socket,
    device; with ``follow_links`` False, a symbolic link) is refused in one line.
    """
    try:
        return open_file(path, follow_links)
    except FileNotFoundError:
        raise
    except IsADirectoryError as e:  # os.open reads a folder: only ``open_file``'s own refusal
        raise GluonMultiGPUError(f'{what} {path} is {e.strerror}; give the name of a regular '
                                 'file') from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise GluonMultiGPUError(f'{what} {path} is a symbolic link, which is not followed '
                                     'here; give the file itself') from None
        raise GluonMultiGPUError(f'{what} {path} cannot be read ({e.strerror}); give a readable '
                                 'file') from None


def read_if_regular(path, read):
    """``read(f)``, ``f`` the file ``path`` opened for reading (binary), if it is a regular file,
    not through a link; else, or if it cannot be read, None: for files the package only looks
    into to see whether they are its own."""
    try:
        with open_regular(path, 'file', follow_links=False) as f:
            return read(f)
    except (OSError, GluonMultiGPUError):
        return None


def read_bytes(path, limit, what, follow_links=True):
    """The content of the regular file ``path``, at most ``limit`` bytes, else one line."""
    with open_regular(path, what, follow_links) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise GluonMultiGPUError(f'{what} {path} is larger than {size_text(limit)}, more than such '
                                 'a file ever holds; give the right file')
    return data


def read_text(path, limit, what, follow_links=True):
    """``read_bytes`` decoded as UTF-8; a file that is not text is one line."""
    try:
        return read_bytes(path, limit, what, follow_links).decode('utf-8')
    except UnicodeDecodeError as e:
        raise GluonMultiGPUError(f'{what} {path} is not UTF-8 text (byte {e.start}); give a text '
                                 'file') from None


def read_json(path, limit, what, follow_links=True):
    """``read_text`` parsed as JSON; a file that is not JSON is one line."""
    text = read_text(path, limit, what, follow_links)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise GluonMultiGPUError(f'{what} {path} is not JSON ({type(e).__name__}: {e}); give the '
                                 'right file') from None


def sha256(f):
    """The SHA-256 of what is left to read of the binary file ``f``, in hex."""
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
    return digest.hexdigest()

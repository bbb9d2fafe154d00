"""The private folder a checkpoint save writes in, recognised as the package's by its content;
and what killed saves left in a checkpoint directory (``leftovers``).

A save (``checkpoint.Checkpointer.save``) makes ``.ckpt-save.XXXXXXXXXXXXXXXX`` in the
checkpoint directory (a random name, mode 0700) and writes in it, first of all, the marker
file ``save-marker``: ``gluon-multigpu-checkpoint-save, pid N``. Then its files (``FILES``).

A folder with such a name is the package's, and may be removed, only when it
holds the whole marker and nothing but the marker and ``FILES``; or nothing but
a marker cut short (a save killed while writing it); or nothing at all. A
user's folder of the same name, or one with anything else in it, is never
touched. It is removed file by file, the marker last, so that a removal killed
half-way leaves a folder still recognised.

Notes
-----
A save records in its folder (``placed.json``) the names, sizes and hashes of the files it
is about to move into the directory, and those of the checkpoint it replaces: killed after
the move, its files are still recognised as its own while they are as it recorded them.
Every change goes through ``fs``; the marker, then the folder's name in the checkpoint
directory, are fsynced before anything else is put in it, and the folder again before the
marker is removed, so that a power cut keeps these steps in their order.
"""
import contextlib
import os
import re
import secrets
import stat

from ..filesafety import atomic, fs, reading
from ..filesafety.targets import CHECKPOINT_FILE

__all__ = ['NAME', 'MARKER', 'FILES', 'PLACED', 'make', 'marked', 'removable', 'remove',
           'leftovers', 'sha256', 'is_regular']

#: The names of save folders.
NAME = re.compile(r'\.ckpt-save\.[A-Za-z0-9_]+')
#: The marker file, written first in a save folder.
MARKER = 'save-marker'
_MARK = b'gluon-multigpu-checkpoint-save, pid '
_WHOLE = re.compile(re.escape(_MARK) + rb'\d+\n')
#: The record of the files a save places.
PLACED = 'placed.json'
#: The files a save writes in its folder, beside the marker.
FILES = ('params', 'states', 'manifest.json', PLACED)


def sha256(path):
    """The SHA-256 of the regular file ``path`` (not a link to one), in hex."""
    with reading.open_file(path, follow_links=False) as f:
        return reading.sha256(f)


def is_regular(path):
    """Whether ``path`` is a regular file (not a link to one)."""
    with contextlib.suppress(OSError):
        return stat.S_ISREG(os.lstat(path).st_mode)
    return False


def make(directory):
    """Make a new save folder in ``directory`` and mark it; return its path.

    If the marker cannot be written, what was made is removed (it is recognised: an empty
    folder, or one holding a marker cut short) and the error raised.
    """
    path = atomic.new_folder(lambda: os.path.join(directory, f'.ckpt-save.{secrets.token_hex(8)}'))
    try:
        atomic.create_exclusive(os.path.join(path, MARKER), _MARK + f'{os.getpid()}\n'.encode())
        atomic.fsync_path(path)  # the marker, then the folder, durable before anything else
        atomic.fsync_path(directory)
    except BaseException:
        with contextlib.suppress(OSError):  # else recognised by the next save, which removes it
            remove(path)
        raise
    return path


def _marker(path):
    """The marker's first 65 bytes (more than a marker holds), or None if not a regular file."""
    return reading.read_if_regular(path, lambda f: f.read(65))


def _cut_short(content):
    """Whether ``content`` is the beginning of a marker (a save killed while writing it)."""
    return _MARK.startswith(content) or (
        content.startswith(_MARK) and re.fullmatch(rb'\d*\n?', content[len(_MARK):]) is not None)


def _entries(path):
    """The names in the folder ``path`` (not a link), or None."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return set(os.listdir(path))
    return None


def marked(path):
    """Whether the folder ``path`` holds the whole marker (its files are then a save's)."""
    content = _marker(os.path.join(path, MARKER))
    return content is not None and _WHOLE.fullmatch(content) is not None


def removable(path):
    """Whether ``path`` is a save folder of the package that may be removed (see above)."""
    names = _entries(path) if NAME.fullmatch(os.path.basename(path)) else None
    if not names:
        return names is not None  # an empty folder of that name is one; anything else is not
    if MARKER not in names or not names <= {MARKER, *FILES}:
        return False
    try:
        kinds = {stat.S_IFMT(os.lstat(os.path.join(path, n)).st_mode) for n in names}
    except OSError:
        return False
    if not kinds <= {stat.S_IFREG, stat.S_IFLNK}:
        return False  # a folder (or a pipe) in it: not what a save makes
    content = _marker(os.path.join(path, MARKER))  # whole, or cut short with nothing beside it
    return content is not None and (_WHOLE.fullmatch(content) is not None or (
        names == {MARKER} and _cut_short(content)))


def remove(path):
    """Remove the save folder ``path`` (``removable``): its files, the marker last (the folder
    fsynced first where files went before it), the folder (``fs.remove_tree``)."""
    files = set(FILES) & (_entries(path) or set())
    fs.remove_tree(path, MARKER, atomic.fsync_path if files else None)


def leftovers(directory, keep=()):
    """What killed saves left in ``directory``: ``(their folders, the names of files they placed)``.

    A folder counts only when ``removable`` (by its marker, not its name); a
    placed file only while it still has the name, size and hash its save
    recorded: anything else under a checkpoint's name is not the package's.
    Files named in ``keep`` (the manifest's) are never leftovers.
    """
    folders, placed = [], set()
    names = []  # no directory: nothing left
    with contextlib.suppress(FileNotFoundError):
        names = os.listdir(directory)
    for name in names:
        path = os.path.join(directory, name)
        if removable(path):
            folders.append(path)
            if marked(path):
                placed |= _recorded(directory, os.path.join(path, PLACED), keep)
    return folders, placed


def _recorded(directory, record_path, keep):
    """The files a save's record names that are still as it placed them, but ``keep``."""
    entries = []  # no record, or not one a save writes (ValueError: not JSON): no files
    with contextlib.suppress(OSError, ValueError, AttributeError, KeyError, TypeError):
        record = reading.read_json(record_path, 1 << 16, 'record', follow_links=False)
        entries = [*record['placed'].values(), *record['replaced'].values()]
    found = set()
    for entry in entries:
        with contextlib.suppress(TypeError, KeyError, OSError):
            target = os.path.join(directory, entry['name'])
            if entry['name'] not in keep and CHECKPOINT_FILE.fullmatch(entry['name']) \
                    and is_regular(target) and os.path.getsize(target) == entry['bytes'] \
                    and sha256(target) == entry['sha256']:
                found.add(entry['name'])
    return found

"""Locks: a file created exclusively, recognised as the package's by its content.

A ``Lock`` is the file ``path``, created whole (written unnamed, ``O_TMPFILE``, then linked
under ``path``, which fails if anything has the name; else ``O_CREAT | O_EXCL | O_NOFOLLOW``):
never opened on an existing file, never seen empty after a kill. It holds the marker line
``MARKER``, the process id and the host, and is held with ``flock`` while the process lives
(the kernel drops it with the process: how a stale lock is told from a held one). When the name
is taken, by a lock of ours (a regular file with the marker, one link) whose ``flock`` is held:
refused in one line naming the holder's process; by a lock of ours that nobody holds: taken
over, with a line to ``say``, once the name is checked to still lead to the same file; by
anything else (a user's file, a hard link to one, a folder, a FIFO, a symbolic link): refused
in one line that names it, and left as it is. ``release`` removes the file only if the name
still leads to the file this process made. On the file-safety floor, below the
hooks that hold one (``observe/metrics``).
"""
import errno
import fcntl
import os
import socket
import stat
import sys
import time

from ..errors import GluonMultiGPUError
from . import fs, reading
from .atomic import _inode, open_new, remove_own

__all__ = ['Lock', 'MARKER']

#: The first line of every lock file of the package.
MARKER = 'gluon-multigpu lock 1'
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(mode):
    if stat.S_ISREG(mode):
        return 'a file that is not a lock of gluon-multigpu'
    what = ('a folder' if stat.S_ISDIR(mode) else 'a symbolic link' if stat.S_ISLNK(mode) else
            'a FIFO' if stat.S_ISFIFO(mode) else 'a device or socket')
    return f'not a regular file ({what})'


def _flocked(fd):
    """Take the ``flock`` of ``fd`` (a descriptor or a file): True, or False if another process
    holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class Lock:
    """The lock file ``path``: ``acquire`` (or ``with``) takes it, ``release`` lets it go.

    Parameters
    ----------
    path : str or os.PathLike
        The lock file.
    held : callable
        ``held(who)`` gives the message when another process holds the lock; ``who`` is
        `` (process 123)`` or empty.
    fix : str
        What to do instead when the name is taken by something that is not our lock (it
        ends the message: ``...; move it away, or FIX``).
    error : type
        The ``GluonMultiGPUError`` subclass raised.
    say : callable, optional
        Takes the line said when a stale lock is taken over (None: printed on stderr).
    wait : float
        Seconds to wait for a held lock before refusing (0: refuse at once).
    """

    def __init__(self, path, held, fix, error=GluonMultiGPUError, say=None, wait=0.0):
        self.path, self.held, self.fix = os.path.abspath(os.fspath(path)), held, fix
        # A stale lock taken over is always said (the output rules promise it): on stderr
        # unless the program gives its own way to say it.
        self.error, self.wait = error, wait
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        # ``held_by``: who held the lock when ``acquire`` last looked (``who`` text), or None
        self._fd, self._inode, self.held_by = None, None, None

    def acquire(self):
        """Take the lock, or raise ``error`` in one line (see the module); returns ``self``."""
        deadline = time.monotonic() + self.wait
        for _ in range(1000):
            if self._create():
                return self
            self.held_by = self._inspect()
            if self.held_by is not None:
                if time.monotonic() >= deadline:
                    raise self.error(self.held(self.held_by))
                time.sleep(0.05)
        raise self.error(f'the lock file {self.path} keeps changing; {self.fix}')

    def _create(self):
        """Make the lock under its name with its content already in it; False if the name is
        taken. The content is written to a file without a name (``O_TMPFILE``) which is then
        linked under the name, so that a kill at any moment leaves either no lock or a whole
        one, never an empty file nobody could recognise. Where the file system has no
        ``O_TMPFILE``, the lock is created with ``O_EXCL`` and written in place."""
        fd = named = None
        try:
            fd, named = open_new(self.path, 0o644, _FLAGS)
            _flocked(fd)  # new, so nobody else holds it
            st = os.fstat(fd)  # ours: removed on failure while its name leads to it (once named)
            self._inode = st.st_dev, st.st_ino
            fs.write(fd, f'{MARKER}\npid {os.getpid()}\nhost {socket.gethostname()}\n'.encode(),
                     self.path)
            if not named:
                fs.fsync(fd, self.path)  # whole after a power cut too, not an empty file
                fs.link_unnamed(fd, self.path)
        except BaseException as e:
            if fd is not None:
                os.close(fd)
                remove_own(self.path, self._inode)  # named: made here; unnamed: nothing named yet
                self._inode = None
            if named or not isinstance(e, OSError):  # a named lock's own write: as it is
                raise
            if isinstance(e, FileExistsError):  # at the open, or at the link: the name is taken
                return False
            raise self.error(f'cannot create the lock file {self.path} ({e.strerror}); '
                             f'{self.fix}') from None
        self._fd = fd
        return True

    def _inspect(self):
        """What has the name now: None after taking over a stale lock (or when the name went
        away: try again), ``who`` text when another process holds it; else raise."""
        try:
            lock = reading.open_file(self.path, follow_links=False)
        except FileNotFoundError:
            return None
        except OSError as e:  # not a regular file (a link, a folder, a FIFO), or unreadable
            try:
                kind = _kind(os.lstat(self.path).st_mode)
            except OSError:
                kind = f'unreadable ({e.strerror})'
            raise self._not_ours(kind) from None
        with lock:
            st = os.fstat(lock.fileno())
            text = lock.read(4096).decode('utf-8', 'replace')
            ours = text.startswith(MARKER + '\n')
            if not _flocked(lock) and (ours or not text):  # held: our lock (or one being written)
                return self._who(text)
            if not ours or st.st_nlink != 1:
                raise self._not_ours(_kind(st.st_mode) if not ours else
                                     'a lock file with another name too (a hard link)')
            if _inode(self.path) == (st.st_dev, st.st_ino):
                fs.unlink(self.path)  # ours, stale, and still under its name: taken over
                self.say(f'note: took over the lock {self.path} of a run that ended without '
                         f'letting it go{self._who(text)}')
            return None

    @staticmethod
    def _who(text):
        fields = dict(line.split(' ', 1) for line in text.splitlines()[1:] if ' ' in line)
        pid = fields.get('pid', '').strip()
        return f' (process {pid})' if pid.isdigit() else ''

    def _not_ours(self, kind):
        return self.error(f'the lock file {self.path} is {kind}; it is left as it is: move it '
                          f'away, or {self.fix}')

    def release(self):
        """Let the lock go: its file removed (while still held) if the name still leads to it."""
        if self._fd is None:
            return
        try:
            remove_own(self.path, self._inode)
        finally:
            os.close(self._fd)
            self._fd, self._inode = None, None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

"""What a writer outside the package's code writes, taken through a pipe: never from a disk.

A writer that is not Python's (MXNet's profiler: C++ that opens the path it is given and
writes) cannot write through ``filesafety/fs``, and it does not report its own failures: past a
file-size limit or on a full disk MXNet's profiler leaves a truncated file and says nothing.
A ``Capture`` gives such a writer a path that leads into a pipe of this process
(``/proc/self/fd/N``, its ``path``); a thread reads what it writes into memory, bounded, so
none of it reaches a disk, and nothing of it can be cut short by one or left behind by a kill.
The package then writes what it makes of it through ``atomic`` like every other output, where
a failure is an ``OSError`` naming the output. ``take`` announces the outside write to ``fs``
(``fs.external``, as MXNet's ``save_parameters`` is), so that the fault harness can fail it,
or kill the process, there; what the writer delivers past ``limit``, or that ``parse``
refuses, is an ``OSError`` naming the output too.
"""
import errno
import os
import threading

from . import fs

__all__ = ['Capture', 'available', 'LIMIT']

#: The most a capture keeps in memory (bytes): past it, ``take`` fails (``EFBIG``).
LIMIT = 1 << 30
_FOLDER = '/proc/self/fd'


def available():
    """Whether this system lets a writer open one of this process's pipes by a path."""
    return os.path.isdir(_FOLDER)


class Capture:
    """A pipe an outside writer is given as its file (``path``), read until ``take`` or
    ``close``; ``output`` names the file the content is for (what the user named), ``what``
    the writer, in the messages. The pipe and its reader live until ``take`` or ``close``."""

    def __init__(self, output, what, limit=LIMIT):
        if not available():
            raise OSError(errno.ENOSYS, f'{what} is read through {_FOLDER}, which this system '
                                        'does not have', output)
        self.output, self.what, self.limit = output, what, limit
        self._read, self._written = os.pipe()
        self._chunks, self._size, self._error = [], 0, None
        self._reader = threading.Thread(target=self._drain, name='gluon-multigpu capture',
                                        daemon=True)
        try:
            self._reader.start()
        except BaseException:
            os.close(self._read)
            os.close(self._written)
            raise
        self.path = os.path.join(_FOLDER, str(self._written))

    def _drain(self):
        """Read the pipe to its end, keeping up to ``limit`` bytes (past it, read on and drop the
        rest, so that the writer never blocks)."""
        try:
            for chunk in iter(lambda: os.read(self._read, 1 << 20), b''):
                self._size += len(chunk)
                if self._size <= self.limit:
                    self._chunks.append(chunk)
        except BaseException as e:  # pylint: disable=broad-except  (raised by ``take``)
            self._error = e

    def take(self, write, parse=bytes):
        """Call ``write()`` (the writer writes its file now, then lets go of ``path``) and return
        ``parse(what it wrote since the capture began)``, bytes by default; the capture is then
        closed. Raises ``OSError`` naming ``output`` where the writer delivered more than
        ``limit`` bytes (``EFBIG``) or what ``parse`` refuses with a ``ValueError`` (``EIO``:
        cut short, damaged); an error of ``write`` itself is raised as it is."""
        try:
            fs.external(self.output)  # the outside write (for the fault harness)
            write()
        finally:
            self.close()
        if self._error is not None:
            raise self._error
        if self._size > self.limit:
            raise OSError(errno.EFBIG, f'{self.what} wrote {self._size} bytes, more than the '
                                       f'{self.limit} it may', self.output)
        data = b''.join(self._chunks)
        try:
            return parse(data)
        except ValueError as e:
            raise OSError(errno.EIO, f'{self.what} delivered {len(data)} bytes that cannot be '
                                     f'read whole ({type(e).__name__}: {e})',
                          self.output) from None

    def close(self):
        """Close the pipe (its reader ends, having read what was written); again: nothing."""
        if self._written is None:
            return
        written, self._written = self._written, None
        os.close(written)  # with the writer's own end closed too, the reader sees the end
        self._reader.join()
        os.close(self._read)


"""The names a launched job's processes share: the agent's control lines and the worker's pipes.

The agent (``multihost.agent``) marks its control lines with ``CONTROL`` and
hands a worker its control pipes through ``CONTROL_VARIABLE``; the worker's
side (``features.distributed.Control``, ``observe.stall``) reads that variable
(``control_fds``). Both sides take the names from here, so that neither
imports the other.
"""
import os

__all__ = ['CONTROL', 'CONTROL_VARIABLE', 'control_fds']

#: What begins a control line on the agent's output (ASCII record separator).
CONTROL = '\x1egm '
#: The variable through which a worker finds its control pipes: ``"READ_FD,WRITE_FD"``.
CONTROL_VARIABLE = 'GLUON_MULTIGPU_CONTROL'


def control_fds(environ=None):
    """``(read_fd, write_fd)`` of this process's control pipes if an agent started it, else None
    (also when the variable is malformed or names descriptors that are not open)."""
    environ = os.environ if environ is None else environ
    try:  # unset or empty: int('') fails too
        read_fd, write_fd = (int(x) for x in (environ.get(CONTROL_VARIABLE) or '').split(','))
        os.fstat(read_fd), os.fstat(write_fd)
    except (ValueError, OSError):
        return None
    return read_fd, write_fd

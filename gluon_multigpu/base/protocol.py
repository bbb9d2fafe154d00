"""The names a launched job's processes share: the agent's control lines and the worker's pipes.

The agent (``multihost.agent``) marks its control lines with ``CONTROL`` and
hands a worker its control pipes through ``CONTROL_VARIABLE``; the worker's
side (``features.distributed.Control``) reads that variable. Both sides take
the names from here, so that neither imports the other.
"""

__all__ = ['CONTROL', 'CONTROL_VARIABLE']

#: What begins a control line on the agent's output (ASCII record separator).
CONTROL = '\x1egm '
#: The variable through which a worker finds its control pipes: ``"READ_FD,WRITE_FD"``.
CONTROL_VARIABLE = 'GLUON_MULTIGPU_CONTROL'

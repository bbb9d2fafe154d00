"""Locks: a file created exclusively, recognised as the package's by its content.

The output layer's name for ``base/lockfile`` (``Lock``, ``MARKER``), which lives on the
ground floor so that a hook of the section (``core/metrics``, the ``metrics`` file) can hold
one as the outputs above do.
"""
from ..base.lockfile import MARKER, Lock

__all__ = ['Lock', 'MARKER']

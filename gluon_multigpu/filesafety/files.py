"""Writing a whole text or JSON file so that nothing half-written is ever left.

The rules of every write are ``output``'s (its docstring: ``atomic_write``,
``ReportSet``, ``recover`` ...); the checks made before any work are
``targets``' (``check_outputs`` ...).
"""
import json

from .output import atomic_write

__all__ = ['write_json', 'write_text']


def write_text(path, text):
    """Write ``text`` to ``path``, atomically."""
    with atomic_write(path, 'w') as f:
        f.write(text)


def write_json(path, obj):
    """Write ``obj`` as indented JSON to ``path``, atomically."""
    write_text(path, json.dumps(obj, indent=2) + '\n')

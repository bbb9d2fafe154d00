"""Writing files so that nothing half-written is ever left: JSON, and the output layer's names.

The rules of every write are ``output``'s (its docstring); the checks made
before any work are ``targets``'. This module keeps the names other modules
and scripts import from it: ``atomic_write``, ``ReportSet``,
``check_outputs`` ...
"""
import json

from .targets import (CHECKPOINT_FILE, check_output_dir, check_output_path,  # noqa: F401
                      check_outputs, check_writable, is_checkpoint_folder, resolve_output)
from .output import (ReportSet, atomic_write, discard_unfinished, makedirs, naming,  # noqa: F401
                     recover)

__all__ = ['atomic_write', 'write_json', 'write_text', 'check_writable', 'check_output_dir',
           'check_output_path', 'check_outputs', 'resolve_output', 'is_checkpoint_folder',
           'ReportSet', 'recover', 'naming', 'discard_unfinished', 'makedirs']


def write_text(path, text):
    """Write ``text`` to ``path``, atomically."""
    with atomic_write(path, 'w') as f:
        f.write(text)


def write_json(path, obj):
    """Write ``obj`` as indented JSON to ``path``, atomically."""
    write_text(path, json.dumps(obj, indent=2) + '\n')

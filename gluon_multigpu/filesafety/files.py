"""Writing files so that nothing half-written is ever left: JSON, CSV, and the output layer's names.

The rules of every write are ``output``'s (its docstring); the checks made
before any work are ``targets``'. This module keeps the names other modules
and scripts import from it: ``atomic_write``, ``ReportFolder``,
``check_outputs`` ...
"""
import contextlib
import csv
import io
import json

from . import reading
from .targets import (CHECKPOINT_FILE, check_output_dir, check_output_path,  # noqa: F401
                      check_outputs, check_writable, is_checkpoint_folder, resolve_output)
from .output import (ReportFolder, ReportSet, atomic_write, discard_unfinished,  # noqa: F401
                     makedirs, naming, recover)

__all__ = ['atomic_write', 'write_json', 'write_csv', 'read_csv', 'check_writable',
           'check_output_dir', 'check_output_path', 'check_outputs',
           'resolve_output', 'is_checkpoint_folder', 'ReportFolder', 'ReportSet', 'recover',
           'naming', 'discard_unfinished', 'makedirs', 'write_text']

#: The most a CSV file read back (``read_csv``) may hold.
CSV_LIMIT = 256 << 20


def write_text(path, text):
    """Write ``text`` to ``path``, atomically."""
    with atomic_write(path, 'w') as f:
        f.write(text)


def write_json(path, obj):
    """Write ``obj`` as indented JSON to ``path``, atomically."""
    write_text(path, json.dumps(obj, indent=2) + '\n')


def write_csv(path, rows, columns):
    """Write ``rows`` (dicts) with ``columns`` as CSV, atomically; ``None`` becomes empty.

    Floats are written in full (Python's shortest exact form), so figures
    recomputed from the file match the ones computed here.
    """
    with atomic_write(path, 'w') as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction='ignore', lineterminator='\n')
        writer.writeheader()
        writer.writerows({k: '' if r.get(k) is None else r[k] for k in columns} for r in rows)


def read_csv(path):
    """Read a CSV written by ``write_csv``: numbers as int or float, empty fields as ``None``."""
    def value(text):
        if text == '':
            return None
        for kind in (int, float):
            with contextlib.suppress(ValueError):
                return kind(text)
        return text
    rows = csv.DictReader(io.StringIO(reading.read_text(path, CSV_LIMIT, 'CSV file'), newline=''))
    return [{k: value(v) for k, v in r.items()} for r in rows]

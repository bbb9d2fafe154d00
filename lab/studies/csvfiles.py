"""The lab's CSV results files: written atomically, stamped, read back with their numbers.

Each write goes through the package's ``atomic_write`` and each read through
``reading.read_text``, so that a CSV file follows the rules of every output
(``gluon_multigpu.filesafety.output``).
"""
import contextlib
import csv
import io

from gluon_multigpu.base.machine import stamp
from gluon_multigpu.filesafety import reading
from gluon_multigpu.filesafety.output import atomic_write

__all__ = ['write_csv', 'read_csv', 'stamped', 'CSV_LIMIT', 'STAMP_COLUMNS']

#: The most a CSV file read back (``read_csv``) may hold.
CSV_LIMIT = 256 << 20
#: The columns ``stamped`` adds to each row of a CSV results file.
STAMP_COLUMNS = ['machine', 'date']


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


def stamped(rows):
    """``rows`` (dicts) with this machine and today's date added to each (``STAMP_COLUMNS``)."""
    mark = stamp()
    return [dict(r, **mark) for r in rows]

"""File safety: every file the package writes or reads back, whole or not at all.

``fs`` (every call that changes a file), ``reading`` (bounded reads of regular
files), ``atomic`` (a file replaced whole), ``foreign`` (what a writer outside
the package writes, taken through a pipe), ``lockfile`` (a lock file: one run
per output), ``paths`` (where an output is written), ``output`` (a file or a
set of files replaced atomically, links followed), ``files`` (JSON, CSV and
report folders), ``targets`` (every output checked writable before any work).
Nothing here loads MXNet, nor imports anything of the package but ``errors``.
"""

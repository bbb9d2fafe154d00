"""The output layer: every file a run writes, whole or not at all.

``output`` (a file or a set of files replaced atomically, links followed),
``files`` (JSON, CSV and report folders), ``targets`` (every output checked
writable before any work) and ``locks`` (one run per folder or results file).
"""

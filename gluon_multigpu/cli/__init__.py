"""The command-line programs: parse, render the library's messages as flags, print.

Each module is one program (``train``, ``demo``, ``bandwidth``, ``scaling``,
``balance``, ``bfloat16``, ``inflight``, ``benchmark``, ``launch``),
installed as the console script ``gluon-multigpu-NAME`` and started from a
checkout as ``python scripts/NAME.py``. ``common`` holds what they share.
Importing any of them loads no MXNet: a program sets MXNet's engine
variables for its device flags first (``common.prepare_engine``).
"""

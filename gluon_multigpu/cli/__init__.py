"""The command-line programs: parse, render the library's messages as flags, print.

Each module is one program (``train``, ``demo``, ``launch``, ``doctor``),
installed as the console script ``gluon-multigpu-NAME`` and started from a
checkout as ``python scripts/NAME.py``. What they share lives by
responsibility: ``arguments`` (argument types, parsers, how errors name the
flags), ``console`` (a program's start, its console streams, its stop
request, its main). What a train command does once parsed is the library's
(``runs``), and so is what the programs say when they stop
(``observe.messages``). Importing a program loads no MXNet: it sets MXNet's
engine variables for its device flags first (``console.prepare_engine``).
"""

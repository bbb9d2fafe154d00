"""What a train command does once parsed, as library code a notebook can call too.

``train_run`` (the checks, the data, a training per kvstore: ``run(config)``
with a ``RunConfig``), ``kvstore_run`` (one kvstore's run, built at its first
turn) and ``comparison`` (the runs of several kvstores taking turns, and the
files they write). Nothing here reads argv: the programs of ``cli`` parse,
and say how the lines name them.
"""

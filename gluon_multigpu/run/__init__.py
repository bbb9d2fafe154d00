"""A run's progress and its stops: ``progress`` (the programs' progress lines) and ``stopping``
(``StopRequest``, ``check_stop``, ``StallGuard``)."""

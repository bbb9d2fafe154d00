"""The measuring studies: ``measure``, ``speed``, ``scaling_model`` and ``scaling_report``
(speed and accuracy on k devices), ``sweep`` (a measurement kept as it is made) and ``budget``;
on a cluster of ``lab.hosts``, ``failover_study`` (``faults``, ``failover_run``,
``failover_report``) and ``network_study`` (``network_model``, ``network_run``,
``network_report``), with what both share in ``jobs``."""

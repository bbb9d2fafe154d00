"""The multi-host laboratory: jobs on several hosts, and a cluster on this machine to try them.

``agent`` (one process of a launched job on its host), ``launch`` (a job's
plan, its hosts checked, its roles started under their agents) and
``supervise`` (``Job``: an attempt watched and stopped in order; the
restarts): the launcher's library, which ``cli/launch.py`` only drives.
``cluster`` (network namespaces on a bridge with an sshd in each: real hosts
on one machine; its parts ``netns``, ``sshd``, ``registry``). The studies on
such a cluster: ``failover`` (a job that loses a worker or a host, and its
restarts: ``faults``, ``failover_run``, ``failover_report``) and ``network``
(the synchronisation cost against a shaped network: ``network_model``,
``network_run``, ``network_report``), with what both share in ``studies``.
The section (``core``) and the exercises (``features``) know nothing of
this wing.
"""

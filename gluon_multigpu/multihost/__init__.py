"""The multi-host laboratory: jobs on several hosts, and a cluster on this machine to try them.

``agent`` (one process of a launched job on its host), ``cluster`` (network
namespaces on a bridge with an sshd in each: real hosts on one machine),
``failover`` (a job that loses a worker or a host, and its restarts) and
``network`` (the synchronisation cost against a shaped network). The section
(``core``) and the exercises (``features``) know nothing of this wing.
"""

"""Hosts on one machine: ``cluster`` (network namespaces on a bridge, an sshd in each: its parts
``netns``, ``sshd``, ``registry``) and ``slurm_cluster`` (munge, slurmctld and a slurmd per
host), for the launcher's tests and the failover and network studies."""

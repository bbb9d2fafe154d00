"""Jobs on several hosts: ``agent`` (one process of a launched job on its host), ``launch`` (a
job's plan, its hosts checked, its roles started under their agents), ``supervise`` (``Job``: an
attempt watched and stopped in order; the restarts) and ``allocation`` (the hosts of a Slurm
allocation): the launcher's library, which ``cli/launch.py`` drives."""

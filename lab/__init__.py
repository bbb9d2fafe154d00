"""The laboratory: what measures and tries the package, run from a checkout, never installed.

``hosts`` (a cluster of network namespaces on this machine, with an sshd in
each and a real Slurm), ``studies`` (the measuring studies: scaling,
bandwidth, the balance and bfloat16 exercises' measurements, the failover
and network studies on a cluster, the sweeps they keep) and ``commands``
(their programs, started as ``python scripts/NAME.py``). The lab imports the
package; the package never imports the lab (``lint-imports``).
"""
import os

#: The checkout that holds the lab (the folder above this one).
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(env):
    """``env`` (a dict, changed) with the checkout first on ``PYTHONPATH``: a child started as
    ``python -m lab...`` finds the lab, wherever its working folder is."""
    paths = [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
    env['PYTHONPATH'] = os.pathsep.join([CHECKOUT, *[p for p in paths if p != CHECKOUT]])
    return env

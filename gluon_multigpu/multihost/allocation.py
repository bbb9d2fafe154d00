"""The launcher's ``slurm`` placement: the nodes of the Slurm allocation it runs in.

The launcher's slurm placement runs inside an allocation (a batch
script of ``sbatch``, or a shell of ``salloc``): its hosts are the
allocation's nodes, in Slurm's order (``scontrol show hostnames
$SLURM_JOB_NODELIST``), each at the address Slurm reaches it at (its
``NodeAddr``); the roles start as job steps (``plan.transport_argv``) instead
of over ssh. The scheduler's port is found free on the first node by the
same check as over ssh, never fixed.
"""
import os
import re
import subprocess

from ..base import signals
from .plan import LaunchError, last_line

__all__ = ['allocation']

_WAIT = 30  # seconds scontrol has to answer


def allocation():
    """``[(address, node), ...]``: the allocation's nodes, in order, with their addresses.

    Raises ``LaunchError`` outside an allocation (no ``SLURM_JOB_ID``), or where
    ``scontrol`` cannot say what the allocation holds.
    """
    if not os.environ.get('SLURM_JOB_ID') or not os.environ.get('SLURM_JOB_NODELIST'):
        raise LaunchError('the slurm placement runs inside a Slurm allocation, and there is '
                          'none here (no SLURM_JOB_ID or SLURM_JOB_NODELIST); run it from a batch '
                          'script (sbatch examples/slurm/train.sbatch ...) or under salloc')
    nodelist = os.environ['SLURM_JOB_NODELIST']
    nodes = _scontrol(['show', 'hostnames', nodelist]).split()
    found = ((re.search(r'\bNodeName=(\S+)', line), re.search(r'\bNodeAddr=(\S+)', line))
             for line in _scontrol(['-o', 'show', 'node', nodelist]).splitlines())
    addresses = {name.group(1): address.group(1) for name, address in found if name and address}
    missing = [n for n in nodes if n not in addresses]
    if not nodes or missing:
        raise LaunchError('scontrol gave no address for the node(s) '
                          f'{", ".join(missing) or nodelist} of allocation '
                          f'{os.environ["SLURM_JOB_ID"]}; check `scontrol show node`')
    return [(addresses[n], n) for n in nodes]


def _scontrol(args):
    """``scontrol ARGS``'s output; ``LaunchError`` with its last line when it fails."""
    try:
        done = subprocess.run(['scontrol', *args], capture_output=True, text=True, timeout=_WAIT,
                              stdin=subprocess.DEVNULL, preexec_fn=signals.dying_with_parent())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f'could not run scontrol ({e}); the slurm placement needs the Slurm '
                          'client programs on the PATH') from None
    if done.returncode:
        raise LaunchError(f'`scontrol {" ".join(args)}` failed: '
                          f'{last_line(done.stderr) or f"status {done.returncode}"}')
    return done.stdout

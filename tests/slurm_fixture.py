"""A fixture making one real Slurm (``lab.hosts.slurm_cluster``) for a test module.

``slurm_cluster`` is a ``SlurmCluster`` of three hosts (munge, slurmctld, a
slurmd per host of a ``Cluster`` of network namespaces), shared by the
module's tests and closed after its last, however it ended. Where no Slurm
can be had here (not root, no slurmctld, no ``ip netns``, ...) the tests
that use it skip with the reason.

Use it from a test module with ``from slurm_fixture import slurm_cluster``.
"""
import pytest

from lab.hosts import cluster as _cluster
from lab.hosts import slurm_cluster as _slurm

__all__ = ['slurm_cluster', 'skip_unless_slurm']


def skip_unless_slurm():
    """Skip the calling test, with the reason, where no Slurm cluster can be made here."""
    for ok, reason in (_cluster.available(), _slurm.available()):
        if not ok:
            pytest.skip(f'no Slurm cluster here: {reason}')


@pytest.fixture(scope='module')
def slurm_cluster():
    """A ``SlurmCluster`` of three hosts, shared by the module's tests."""
    skip_unless_slurm()
    made = _cluster.Cluster(3)
    try:
        with _slurm.SlurmCluster(made) as slurm:
            yield slurm
    finally:
        made.close()

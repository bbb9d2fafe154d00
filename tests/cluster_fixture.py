"""Fixtures making real small clusters (``lab.hosts.cluster``), closed at teardown.

``make_cluster`` (one test) and ``make_module_cluster`` (one module) each
give a function ``make(num_hosts=3, **kw)`` that returns a new ``Cluster``
(``kw`` as for ``Cluster``); every cluster made is closed when the fixture
ends, however the test ended. Where no cluster can be made here (not root,
no ``ip netns``, no sshd, ...) ``make`` skips the test with the reason.

Use them from a test module with ``from cluster_fixture import make_cluster``
(the tests folder is on ``sys.path``), or import them in conftest.py.
"""
import pytest

from lab.hosts import cluster as _cluster

__all__ = ['ClusterFactory', 'make_cluster', 'make_module_cluster']


class ClusterFactory:
    """``make(num_hosts=3, **kw)`` returning a new ``Cluster``; ``close()`` closes all it made."""

    def __init__(self):
        self.made = []

    def __call__(self, num_hosts=3, **kw):
        ok, reason = _cluster.available()
        if not ok:
            pytest.skip(f'no cluster here: {reason}')
        made = _cluster.Cluster(num_hosts, **kw)
        self.made.append(made)
        return made

    def close(self):
        while self.made:
            self.made.pop().close()  # never raises


@pytest.fixture
def make_cluster():
    """A function ``make(num_hosts=3, **kw)`` making clusters closed at the test's end."""
    factory = ClusterFactory()
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope='module')
def make_module_cluster():
    """As ``make_cluster``, the clusters shared by the module's tests and closed after its last."""
    factory = ClusterFactory()
    try:
        yield factory
    finally:
        factory.close()

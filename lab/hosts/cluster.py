"""A real small cluster on one machine: network namespaces joined by a bridge, each running sshd.

For tests and studies of training over several hosts without several
machines. Each of the N hosts is a network namespace with one address,
``198.18.K.(i+2)``, on a veth whose other end is a port of a Linux bridge in
the root namespace (``198.18.K.1``); each runs its own OpenSSH server. A
launcher here reaches every host with plain ``ssh HOST CMD`` (through
``Cluster.env()``), and the hosts reach each other over TCP. The hosts share
this machine's filesystem and processes' view of it: the same checkout and the
same Python (``sys.executable``) work on every host; only the network differs.

In lab/NOTES.md, under this module's name.
"""
import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

from lab.hosts import netns
from lab.hosts import registry
from lab.hosts import sshd
from lab.hosts.netns import ClusterError, rate_bytes
from lab.hosts.registry import REGISTRY, remove_stale
from gluon_multigpu.base import engine
from gluon_multigpu.filesafety import fs
from gluon_multigpu.filesafety import output

__all__ = ['available', 'ClusterError', 'Cluster', 'remove_stale', 'rate_bytes', 'checkout', 'program',
           'REGISTRY']

#: The most hosts a cluster has: 198.18.K.2 to 198.18.K.253.
MAX_HOSTS = 252


def checkout():
    """The checkout beside the package (its ``scripts/``), or None for an installed package."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return root if os.path.isfile(os.path.join(root, 'scripts', 'launch.py')) else None


def program(name):
    """How a host starts program ``name`` (``train``, ``launch``, ...) with this Python, which
    every host shares: the checkout's script, or the package's module."""
    root = checkout()
    if root:
        return [sys.executable, os.path.join(root, 'scripts', f'{name}.py')]
    return [sys.executable, '-m', f'gluon_multigpu.cli.{name}']


def available():
    """``(True, '')`` where a cluster can be made here, else ``(False, reason)``.

    Needs root, Linux, ``ip`` whose ``netns`` works (and a process may
    enter a new network namespace), ``tc``, ``/usr/sbin/sshd``, ``ssh`` and
    ``ssh-keygen``. Changes nothing.
    """
    if not sys.platform.startswith('linux'):
        return False, f'network namespaces need Linux, not {sys.platform}'
    if os.geteuid() != 0:
        return False, 'network namespaces need root (this process runs as uid %d)' % os.geteuid()
    for tool in ('ip', 'tc', 'ssh', 'ssh-keygen'):
        if not shutil.which(tool):
            return False, f'no `{tool}` on PATH'
    if not os.access(sshd.SSHD, os.X_OK):
        return False, f'no OpenSSH server at {sshd.SSHD}'
    done = netns.run(['ip', 'netns', 'list'])  # a failure to run it is its status 1
    if done.returncode:
        return False, f'`ip netns list` failed: {netns.last_line(done.stderr)}'
    if shutil.which('unshare'):
        done = netns.run(['unshare', '--net', 'true'])
        if done.returncode:
            return False, f'cannot enter a new network namespace: {netns.last_line(done.stderr)}'
    return True, ''


class Cluster:
    """N hosts (network namespaces) on a bridge, each with its own sshd; a context manager.

    (More: lab/NOTES.md.)
    """

    def __init__(self, num_hosts=3, *, bandwidth=None, ssh_port=22, workdir=None):
        if not isinstance(num_hosts, int) or not 1 <= num_hosts <= MAX_HOSTS:
            raise ValueError(f'num_hosts must be 1 to {MAX_HOSTS}, not {num_hosts!r}')
        if not isinstance(ssh_port, int) or not 1 <= ssh_port <= 65535:
            raise ValueError(f'ssh_port must be 1 to 65535, not {ssh_port!r}')
        if bandwidth is not None:
            rate_bytes(bandwidth)
        ok, reason = available()
        if not ok:
            raise ClusterError(f'cannot make a cluster here: {reason}')
        self.num_hosts, self.bandwidth, self.ssh_port = num_hosts, bandwidth, ssh_port
        # the hosts share this machine's cores: each is given its part (base.engine)
        self.host_cores = max(1, engine.cores() // num_hosts)
        self.hosts, self.namespaces, self.veths = [], [], []
        self.name = self.bridge = self.subnet = self.gateway = None
        self._closed, self._sshd, self._popens = False, {}, []
        self._own_workdir = workdir is None
        # mkdtemp: a new private folder of a unique name, made exclusively; the cluster's own
        self.workdir = os.path.abspath(tempfile.mkdtemp(prefix='gluon-multigpu-cluster-')
                                       if workdir is None else workdir)
        self._registered, self._creator = None, os.getpid()
        atexit.register(self._close_at_exit)
        try:
            output.makedirs(self.workdir)
            self._reserve()
            self._write_files()
            self._make_network()
            self._start_sshds()
        except BaseException as e:
            self.close()
            if isinstance(e, ClusterError) or not isinstance(e, Exception):
                raise
            raise ClusterError(f'cluster setup failed: {type(e).__name__}: {e}') from e

    # -- setup -------------------------------------------------------------------------------------

    def _reserve(self):
        """Remove stale clusters, pick a free 198.18.K.0/24 and register it under our pid."""
        k, self._registered = registry.reserve(self.workdir, self._own_workdir)
        self.name = f'{netns.PREFIX}{k}'
        self.subnet = f'198.18.{k}.0/24'
        self.gateway = f'198.18.{k}.1'
        self.bridge = f'{self.name}br'
        self.hosts = [f'198.18.{k}.{i + 2}' for i in range(self.num_hosts)]
        self.namespaces = [f'{self.name}h{i}' for i in range(self.num_hosts)]
        self.veths = [f'{self.name}v{i}' for i in range(self.num_hosts)]

    def _write_files(self):
        """Keys, sshd and ssh configurations, known hosts, hostfile, the ``ssh`` wrapper
        (``sshd.write_files``: all of them or none replaced)."""
        made = sshd.write_files(self.workdir, self.name, self.hosts, self.ssh_port,
                                self.host_cores)
        self.identity, self.hostfile, self.ssh_config = made.identity, made.hostfile, made.ssh_config
        self._sshd_configs, self._ssh, self.bin_dir = made.sshd_configs, made.ssh, made.bin_dir

    def _make_network(self):
        """The bridge, the rule keeping packets here, and each host's namespace and link."""
        netns.make(self.bridge, self.gateway, self.subnet.split('/')[1], self.namespaces,
                   self.veths, self.hosts)
        if self.bandwidth is not None:
            for i in range(self.num_hosts):
                self.shape(i, self.bandwidth)

    def _start_sshds(self):
        """Start one sshd in each namespace; wait until each listens on its address."""
        sshd.start(self._sshd, self.namespaces, self.hosts, self.ssh_port, self._sshd_configs,
                   self.workdir)

    # -- use ---------------------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = 'closed' if self._closed else ', '.join(self.hosts)
        return f'<Cluster {self.name} {self.subnet}: {state}>'

    def env(self, environ=None):
        """A copy of ``environ`` (default ``os.environ``) with ``bin_dir`` first on PATH.

        A program run with it that runs plain ``ssh HOST CMD`` reaches the hosts.
        """
        env = dict(os.environ if environ is None else environ)
        path = env.get('PATH', os.defpath)
        env['PATH'] = self.bin_dir + (os.pathsep + path if path else '')
        return env

    def ssh(self, i, command, **kw):
        """Run the shell ``command`` on host ``i`` over ssh; its ``CompletedProcess`` (text, captured).

        Root's shell runs it with a minimal PATH: name programs by absolute
        path. ``kw`` goes to ``subprocess.run`` (``timeout``, ``check``,
        ``input``, ...); stdin is /dev/null unless ``input`` or ``stdin`` is
        given.
        """
        return subprocess.run([self._ssh, '-F', self.ssh_config, self._host(i), command],
                              **_run_defaults(kw))

    def run_in(self, i, argv, **kw):
        """Run ``argv`` inside host ``i``'s namespace directly (``ip netns exec``), not over ssh.

        Its ``CompletedProcess`` (text, captured); ``kw`` as for ``ssh``.
        """
        return subprocess.run(self._in(i, argv), **_run_defaults(kw))

    def popen_in(self, i, argv, **kw):
        """Start ``argv`` inside host ``i``'s namespace (``ip netns exec``); its ``Popen``.

        ``kw`` goes to ``subprocess.Popen`` as it is. ``close`` kills it if
        it still runs (as every process in the namespaces).
        """
        proc = subprocess.Popen(self._in(i, argv), **kw)
        self._popens = [p for p in self._popens if p.returncode is None] + [proc]
        return proc

    def pids(self, i):
        """The processes inside host ``i``'s namespace, except its sshd listener (ascending)."""
        return self._scan([i]).get(i, [])

    def job_pids(self):
        """``{i: pids(i)}`` for every host that has any process but its sshd listener."""
        return self._scan(range(len(self.namespaces)))

    def link_down(self, i):
        """Cut host ``i``'s link: both ends of its veth go down (addresses and routes stay)."""
        self._host(i)
        netns.set_link(self.namespaces[i], self.veths[i], up=False)

    def link_up(self, i):
        """Restore host ``i``'s link after ``link_down`` or ``kill_host``."""
        self._host(i)
        netns.set_link(self.namespaces[i], self.veths[i], up=True)

    def shape(self, i, rate):
        """Limit host ``i``'s link to ``rate`` (a tc rate, e.g. ``'100mbit'``) in both directions.

        A token bucket filter (tbf) on the host's end of the veth (what it
        sends) and on the bridge's end (what it receives), replacing any
        before. Its bucket holds 1/250 s of the rate (at least 64 KiB), so
        that 1 Gbit/s is reached; packets that would wait more than 50 ms
        are dropped.
        """
        self._host(i)
        netns.shape(self.namespaces[i], self.veths[i], rate)

    def unshape(self, i):
        """Remove host ``i``'s shaping (both directions); nothing if it has none."""
        self._host(i)
        netns.unshape(self.namespaces[i], self.veths[i])

    def kill_host(self, i):
        """Host ``i`` is gone: SIGKILL every process in its namespace (sshd too), then cut its link.

        The processes are gone when it returns, so their connections were
        closed (FIN or RST sent) before the link was cut; nothing reaches
        the host afterwards.
        """
        self._host(i)
        netns.kill_namespaces([self.namespaces[i]])
        self._reap()
        self.link_down(i)

    def close(self):
        """Tear the cluster down: kill every process left in the namespaces, remove everything.

        The namespaces, veths, bridge, rule, qdiscs (with their links), the
        registry entry and the temporary workdir. Safe to call more than
        once, and never raises.
        """
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self._close_at_exit)
        try:
            if self.name is not None:
                netns.remove(self.name, self.bridge, self.namespaces, self.veths)
            self._reap(wait=True)
        except Exception:  # pylint: disable=broad-except
            pass
        if self._own_workdir:  # made by mkdtemp for this cluster alone: all of it is ours
            with contextlib.suppress(OSError):
                fs.remove_tree(self.workdir)
        if self._registered:
            with contextlib.suppress(OSError):
                fs.unlink(self._registered)  # our record, made exclusively

    def _close_at_exit(self):
        if os.getpid() == self._creator:  # not in a child forked from the creator
            self.close()

    # -- helpers -----------------------------------------------------------------------------------

    def _host(self, i):
        if self._closed:
            raise ClusterError(f'cluster {self.name} is closed')
        if not isinstance(i, int) or not 0 <= i < len(self.hosts):
            raise IndexError(f'no host {i!r}: the cluster has hosts 0 to {len(self.hosts) - 1}')
        return self.hosts[i]

    def _in(self, i, argv):
        self._host(i)
        if isinstance(argv, (str, bytes)):
            raise TypeError('argv is a list of arguments, not a string (a shell command goes to ssh())')
        return ['ip', 'netns', 'exec', self.namespaces[i], *map(os.fspath, argv)]

    def _scan(self, indices):
        listeners = {p.pid for p in self._sshd.values() if p.returncode is None}
        found = netns.namespace_pids([self.namespaces[i] for i in indices])
        result = {}
        for i in indices:
            pids = sorted(set(found.get(self.namespaces[i], ())) - listeners)
            if pids:
                result[i] = pids
        return result

    def _reap(self, wait=False):
        """Collect the processes we started that have ended (no zombies left behind)."""
        for proc in list(self._sshd.values()) + self._popens:
            if proc.returncode is None:
                with contextlib.suppress(Exception):
                    proc.wait(timeout=1.0) if wait else proc.poll()
        self._popens = [p for p in self._popens if p.returncode is None]


def _run_defaults(kw):
    kw = dict(kw)
    if 'capture_output' not in kw:
        kw.setdefault('stdout', subprocess.PIPE)
        kw.setdefault('stderr', subprocess.PIPE)
    if 'input' not in kw:
        kw.setdefault('stdin', subprocess.DEVNULL)
    if not any(k in kw for k in ('text', 'universal_newlines', 'encoding', 'errors')):
        kw['text'] = True
    return kw


if __name__ == '__main__':
    # python -m lab.hosts.cluster: remove the clusters of processes that died unclosed
    ok, why = available()
    if not ok:
        sys.exit(f'cluster: {why}')
    gone = remove_stale()
    print(f'removed {len(gone)} stale cluster(s){": " + ", ".join(gone) if gone else ""}')

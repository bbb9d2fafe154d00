"""A real small cluster on one machine: network namespaces joined by a bridge, each running sshd.

For tests and studies of training over several hosts without several
machines. Each of the N hosts is a network namespace with one address,
``198.18.K.(i+2)``, on a veth whose other end is a port of a Linux bridge in
the root namespace (``198.18.K.1``); each runs its own OpenSSH server. A
launcher here reaches every host with plain ``ssh HOST CMD`` (through
``Cluster.env()``), and the hosts reach each other over TCP. The hosts share
this machine's filesystem and processes' view of it: the same checkout and the
same Python (``sys.executable``) work on every host; only the network differs.

Only addresses of 198.18.0.0/15 (the benchmarking range, RFC 2544) are used,
one /24 per cluster, chosen so that clusters of several processes at once
never collide. Nothing leaves the machine: the bridge has no other port, and a
routing rule in the root namespace answers "unreachable" to any packet from the
bridge that is not for an address of this machine, so the hosts' default route
(via the bridge address) never forwards anything, even where IP forwarding is
on.

Links can be cut and restored (``link_down``, ``link_up``), shaped with a
token bucket (``shape``; ``bandwidth`` for every link from the start) and a
host can be made to vanish (``kill_host``). ``close`` (also at the end of a
``with`` block and at exit) kills every process left in the namespaces and
removes every namespace, link, rule and file it made. A cluster whose creating
process died without closing it (SIGKILL) is removed by the next one: each
cluster is registered in ``/run/gluon-multigpu-clusters`` with its creator's
process id and start time.

Needs root, iproute2 (``ip netns``, ``tc``) and OpenSSH (``/usr/sbin/sshd``,
``ssh``, ``ssh-keygen``); ``available()`` says whether all are there. Pure
standard library: it loads neither MXNet nor NumPy.
"""
import atexit
import contextlib
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from ..errors import GluonMultiGPUError
from ..base import fs, reading
from ..run import locks, output

__all__ = ['available', 'ClusterError', 'Cluster', 'remove_stale', 'rate_bytes', 'checkout', 'program']

SSHD = '/usr/sbin/sshd'
#: The range every cluster's addresses come from: 198.18.K.0/24, K in 1..254.
RANGE = ipaddress.ip_network('198.18.0.0/15')
#: Where each live cluster is registered (``<name>.json``: its creator's pid, start time, workdir).
REGISTRY = '/run/gluon-multigpu-clusters'
#: The privilege separation directory sshd needs.
PRIVSEP_DIR = '/run/sshd'
#: The preference of the routing rule that keeps a cluster's packets on this machine.
RULE_PREF = 1000
#: A host's interface inside its namespace.
HOST_IF = 'eth0'
#: The most hosts a cluster has: 198.18.K.2 to 198.18.K.253.
MAX_HOSTS = 252
#: tbf's queue: packets that would wait longer than this are dropped.
TBF_LATENCY = '50ms'
#: tbf's smallest bucket (bytes): several full-size (GSO) packets.
TBF_MIN_BURST = 64 * 1024

_PREFIX = 'gmc'
_NAME = re.compile(rf'^{_PREFIX}(\d+)(?:h\d+|v\d+|br)$')
_RATE = re.compile(r'^(\d+(?:\.\d*)?|\.\d+)([a-z]*)$', re.IGNORECASE)
_RATE_UNITS = {'': 1 / 8, 'bit': 1 / 8, 'bps': 1}
for _i, _p in enumerate('kmgt', 1):
    _RATE_UNITS.update({f'{_p}bit': 1000 ** _i / 8, f'{_p}bps': 1000 ** _i,
                        f'{_p}ibit': 1024 ** _i / 8, f'{_p}ibps': 1024 ** _i})
del _i, _p
_ROUTE_TYPES = {'unicast', 'local', 'broadcast', 'multicast', 'anycast', 'blackhole', 'unreachable',
                'prohibit', 'throw', 'nat'}
_WAIT_SSHD = 10.0  # seconds each sshd has to listen
_CMD_TIMEOUT = 30  # seconds any one ip/tc/ssh-keygen command may take


class ClusterError(Exception):
    """A cluster could not be set up or changed; the message is one line."""


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
    if not os.access(SSHD, os.X_OK):
        return False, f'no OpenSSH server at {SSHD}'
    try:
        done = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True, timeout=_CMD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f'`ip netns list` failed: {e}'
    if done.returncode:
        return False, f'`ip netns list` failed: {_last_line(done.stderr)}'
    if shutil.which('unshare'):
        try:
            done = subprocess.run(['unshare', '--net', 'true'], capture_output=True, text=True,
                                  timeout=_CMD_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f'cannot enter a new network namespace: {e}'
        if done.returncode:
            return False, f'cannot enter a new network namespace: {_last_line(done.stderr)}'
    return True, ''


def rate_bytes(rate):
    """The bytes per second of a tc rate such as ``'100mbit'``, ``'1gbit'``, ``'10mbps'``.

    tc's units: ``bit`` (or none), ``kbit``, ``mbit``, ``gbit``, ``tbit``,
    their binary forms (``mibit``, ...), and the byte rates ``bps``,
    ``kbps``, ... (case ignored). ``ValueError`` for anything else (tc's
    percentages of the link speed included: a veth has no speed).
    """
    match = _RATE.match(str(rate).strip())
    unit = match and match.group(2).lower()
    if not match or unit not in _RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f'not a tc rate: {rate!r} (e.g. 100mbit, 1gbit, 10mbps)')
    return float(match.group(1)) * _RATE_UNITS[unit]


def remove_stale():
    """Remove every cluster whose creating process is gone; return their names.

    What ``Cluster()`` does first. Its processes are killed, its namespaces,
    links and rule deleted, its temporary workdir removed.
    """
    with _registry_lock():
        return _remove_stale_locked()


class Cluster:
    """N hosts (network namespaces) on a bridge, each with its own sshd; a context manager.

    ``hosts`` are their addresses (``198.18.K.2``, ...), ``hostfile`` a file
    listing them one a line, ``ssh_config`` an ssh client configuration
    (``ssh -F``) that logs into each as root with no prompt, ``identity``
    its private key, and ``bin_dir`` a folder whose ``ssh`` runs
    ``ssh -F ssh_config``; ``env()`` puts it first on PATH. ``bandwidth``
    (a tc rate, e.g. ``'100mbit'``) shapes every host's link in both
    directions; ``ssh_port`` is where each sshd listens. Keys, configurations
    and the sshd logs (``sshd-<i>.log``) go to ``workdir``, by default a
    fresh temporary folder removed by ``close``; a folder given is left as
    it is.

    Also: ``name`` (the prefix of every namespace and interface, e.g.
    ``gmc17``), ``subnet`` (``198.18.17.0/24``), ``gateway`` (the bridge's
    address, ``198.18.17.1``), ``namespaces`` (host i's is
    ``namespaces[i]``), ``bridge``, ``veths`` (the root namespace's end of
    each host's link; the host's own end is ``eth0`` in its namespace).

    Setup that fails removes what it made and raises ``ClusterError``.
    ``close`` tears everything down, however the ``with`` block ends (and at
    exit, if never called).
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
        with _registry_lock():
            _remove_stale_locked()
            taken = _taken_subnets()
            free = [k for k in range(1, 255) if k not in taken]
            if not free:
                raise ClusterError('no free 198.18.K.0/24 for a cluster: all 254 are in use')
            k = random.choice(free)
            self.name = f'{_PREFIX}{k}'
            record = {'pid': os.getpid(), 'start': _start_time(os.getpid()), 'workdir': self.workdir,
                      'remove_workdir': self._own_workdir}
            path = os.path.join(REGISTRY, f'{self.name}.json')
            output.create_exclusive(path, json.dumps(record).encode(), 0o644)
            self._registered = path
        self.subnet = f'198.18.{k}.0/24'
        self.gateway = f'198.18.{k}.1'
        self.bridge = f'{self.name}br'
        self.hosts = [f'198.18.{k}.{i + 2}' for i in range(self.num_hosts)]
        self.namespaces = [f'{self.name}h{i}' for i in range(self.num_hosts)]
        self.veths = [f'{self.name}v{i}' for i in range(self.num_hosts)]

    def _write_files(self):
        """Keys, sshd and ssh configurations, known hosts, hostfile, the ``ssh`` wrapper.

        The keys and files are made in a staging folder and moved into the workdir together
        (``output.ReportSet``): a failure or kill leaves the previous cluster's set as it was,
        or the new one complete, never old keys gone before the new ones exist.
        """
        w = self.workdir
        host_key, self.identity = os.path.join(w, 'ssh_host_ed25519_key'), os.path.join(w, 'id_ed25519')
        for key in (host_key, self.identity):
            _check_own_key(key)
        authorized, known = os.path.join(w, 'authorized_keys'), os.path.join(w, 'known_hosts')
        self.hostfile, self.ssh_config = os.path.join(w, 'hostfile'), os.path.join(w, 'ssh_config')
        self._sshd_configs = [os.path.join(w, f'sshd_config-{i}') for i in range(len(self.hosts))]
        with output.ReportSet(w) as staged:
            def at(path):
                return staged.path(os.path.basename(path))
            for key in (host_key, self.identity):
                at(key + '.pub')  # ssh-keygen writes it beside the key: moved in with it
                _check(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', f'gluon-multigpu {self.name}',
                        '-f', at(key)])
            host_pub = _read(at(host_key + '.pub')).split()[:2]
            _write(at(authorized), _read(at(self.identity + '.pub')))
            _write(at(known), ''.join(f'{h if self.ssh_port == 22 else f"[{h}]:{self.ssh_port}"} {" ".join(host_pub)}\n'
                                      for h in self.hosts))
            _write(at(self.hostfile), ''.join(h + '\n' for h in self.hosts))
            for path, host in zip(self._sshd_configs, self.hosts):
                _write(at(path), _sshd_config(host, self.ssh_port, host_key, authorized))
            _write(at(self.ssh_config), _ssh_config(self.identity, self.ssh_port, known))
        # /usr/bin/ssh, not the first on PATH: that may be another cluster's wrapper (a cluster made under env())
        self._ssh = '/usr/bin/ssh' if os.access('/usr/bin/ssh', os.X_OK) else shutil.which('ssh')
        self.bin_dir = os.path.join(w, 'bin')
        output.makedirs(self.bin_dir)
        wrapper = os.path.join(self.bin_dir, 'ssh')
        _write(wrapper, f'#!/bin/sh\nexec {_sh_quote(self._ssh)} -F {_sh_quote(self.ssh_config)} "$@"\n')
        os.chmod(wrapper, 0o755)

    def _make_network(self):
        """The bridge, the rule keeping packets here, and each host's namespace and link."""
        prefix = self.subnet.split('/')[1]
        _check(['ip', 'link', 'add', self.bridge, 'type', 'bridge'])
        _check(['ip', 'addr', 'add', f'{self.gateway}/{prefix}', 'dev', self.bridge])
        _check(['ip', 'link', 'set', self.bridge, 'up'])
        _check(['ip', 'rule', 'add', 'pref', str(RULE_PREF), 'iif', self.bridge, 'unreachable'])
        for i, (ns, veth, host) in enumerate(zip(self.namespaces, self.veths, self.hosts)):
            _check(['ip', 'netns', 'add', ns])
            _check(['ip', 'link', 'add', veth, 'type', 'veth', 'peer', 'name', HOST_IF, 'netns', ns])
            _check(['ip', 'link', 'set', veth, 'master', self.bridge, 'up'])
            _check(['ip', '-n', ns, 'link', 'set', 'lo', 'up'])
            _check(['ip', '-n', ns, 'addr', 'add', f'{host}/{prefix}', 'dev', HOST_IF])
            _check(['ip', '-n', ns, 'link', 'set', HOST_IF, 'up'])
            _check(['ip', '-n', ns, 'route', 'add', 'default', 'via', self.gateway])
            if self.bandwidth is not None:
                self.shape(i, self.bandwidth)

    def _start_sshds(self):
        """Start one sshd in each namespace; wait until each listens on its address."""
        output.makedirs(PRIVSEP_DIR, mode=0o755)
        for i, ns in enumerate(self.namespaces):
            with open(self._sshd_log(i), 'ab') as log:  # sshd appends its log (a file of this cluster's own workdir)
                self._sshd[i] = subprocess.Popen(
                    ['ip', 'netns', 'exec', ns, SSHD, '-D', '-e', '-f', self._sshd_configs[i]],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + _WAIT_SSHD
        for i, host in enumerate(self.hosts):
            while not _listens(self._sshd[i].pid, host, self.ssh_port):
                if self._sshd[i].poll() is not None:
                    raise ClusterError(f'the sshd of host {i} ({host}) ended with status '
                                       f'{self._sshd[i].returncode}: {self._log_tail(i)}')
                if time.monotonic() > deadline:
                    raise ClusterError(f'the sshd of host {i} ({host}) did not listen on port {self.ssh_port} '
                                       f'within {_WAIT_SSHD:g} s: {self._log_tail(i)}')
                time.sleep(0.02)

    def _sshd_log(self, i):
        return os.path.join(self.workdir, f'sshd-{i}.log')

    def _log_tail(self, i, lines=3):
        try:
            tail = [line.strip() for line in _read(self._sshd_log(i)).splitlines() if line.strip()]
        except OSError:
            tail = []
        return ' | '.join(tail[-lines:]) or '(its log is empty)'

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
        _check(['ip', 'link', 'set', self.veths[i], 'down'])
        _check(['ip', '-n', self.namespaces[i], 'link', 'set', HOST_IF, 'down'])

    def link_up(self, i):
        """Restore host ``i``'s link after ``link_down`` or ``kill_host``."""
        self._host(i)
        _check(['ip', '-n', self.namespaces[i], 'link', 'set', HOST_IF, 'up'])
        _check(['ip', 'link', 'set', self.veths[i], 'up'])

    def shape(self, i, rate):
        """Limit host ``i``'s link to ``rate`` (a tc rate, e.g. ``'100mbit'``) in both directions.

        A token bucket filter (tbf) on the host's end of the veth (what it
        sends) and on the bridge's end (what it receives), replacing any
        before. Its bucket holds 1/250 s of the rate (at least 64 KiB), so
        that 1 Gbit/s is reached; packets that would wait more than 50 ms
        are dropped.
        """
        self._host(i)
        burst = str(max(TBF_MIN_BURST, int(rate_bytes(rate) / 250)))
        tbf = ['qdisc', 'replace', 'dev', None, 'root', 'tbf', 'rate', str(rate).strip(), 'burst', burst,
               'latency', TBF_LATENCY]
        for prefix, dev in ((['tc', '-n', self.namespaces[i]], HOST_IF), (['tc'], self.veths[i])):
            tbf[3] = dev
            _check(prefix + tbf)

    def unshape(self, i):
        """Remove host ``i``'s shaping (both directions); nothing if it has none."""
        self._host(i)
        for prefix, dev in ((['tc', '-n', self.namespaces[i]], HOST_IF), (['tc'], self.veths[i])):
            _run(prefix + ['qdisc', 'del', 'dev', dev, 'root'])

    def kill_host(self, i):
        """Host ``i`` is gone: SIGKILL every process in its namespace (sshd too), then cut its link.

        The processes are gone when it returns, so their connections were
        closed (FIN or RST sent) before the link was cut; nothing reaches
        the host afterwards.
        """
        self._host(i)
        _kill_namespaces([self.namespaces[i]])
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
                _remove_cluster(self.name, self.bridge, self.namespaces, self.veths)
            self._reap(wait=True)
        except Exception:  # pylint: disable=broad-except
            pass
        if self._own_workdir:  # made by mkdtemp for this cluster alone: all of it is ours
            shutil.rmtree(self.workdir, ignore_errors=True)
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
        found = _namespace_pids([self.namespaces[i] for i in indices])
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


# -- the registry, stale clusters, teardown ---------------------------------------------------------

def _registry_lock(timeout=60.0):
    """The lock of the registry (``locks.Lock``, waiting up to ``timeout`` s for its holder)."""
    output.makedirs(REGISTRY, mode=0o755)
    return locks.Lock(os.path.join(REGISTRY, '.registry.lock'),
                      held=lambda who: f'the cluster registry {REGISTRY} stayed locked{who} for '
                                       f'{timeout:g} s',
                      fix=f'remove {REGISTRY} once no cluster runs', error=ClusterError,
                      wait=timeout)


def _remove_stale_locked():
    removed = []
    for entry in sorted(os.listdir(REGISTRY)):
        if not entry.endswith('.json'):
            continue
        path = os.path.join(REGISTRY, entry)
        try:
            record = json.loads(_read(path))
            start = _start_time(int(record['pid']))
            alive = start is not None and start == record['start']
        except (OSError, ValueError, KeyError, TypeError, GluonMultiGPUError):
            continue  # not a record of ours (or unreadable): left as it is
        if alive:
            continue
        name = entry[:-len('.json')]
        _remove_cluster(name)
        if record.get('remove_workdir') and isinstance(record.get('workdir'), str):
            # a folder mkdtemp made for that cluster alone (its record says so): all of it is its
            shutil.rmtree(record['workdir'], ignore_errors=True)
        with contextlib.suppress(OSError):
            fs.unlink(path)  # a record of ours (it parsed as one), of a cluster now gone
        removed.append(name)
    return removed


def _remove_cluster(name, bridge=None, namespaces=(), veths=()):
    """Kill the processes of cluster ``name``'s namespaces; delete them, its veths, bridge and rule.

    Whatever of them exists: by the names given and by every name of the
    form ``<name>h<i>``, ``<name>v<i>``, ``<name>br`` found. Never raises.
    """
    try:
        def ours(n):
            m = _NAME.match(n)
            return m is not None and f'{_PREFIX}{m.group(1)}' == name

        namespaces = sorted(set(namespaces) | {n for n in _netns_list() if ours(n)})
        links = _link_names()
        veths = sorted(set(veths) | {n for n in links if ours(n) and n != f'{name}br'})
        bridge = bridge or f'{name}br'
        _kill_namespaces(namespaces)
        for veth in veths:  # both ends go at once (the host's end would go with its namespace, later)
            if veth in links:
                _run(['ip', 'link', 'del', veth])
        for ns in namespaces:
            _run(['ip', 'netns', 'del', ns])
        if bridge in links:
            _run(['ip', 'link', 'del', bridge])
        for _ in range(8):  # one rule each, unless setup was repeated
            if _run(['ip', 'rule', 'del', 'pref', str(RULE_PREF), 'iif', bridge, 'unreachable']).returncode:
                break
    except Exception:  # pylint: disable=broad-except
        pass


def _kill_namespaces(namespaces, timeout=5.0):
    """SIGKILL every process in ``namespaces`` until none is left (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for found in _namespace_pids(namespaces).values() for p in found]
        if not pids or time.monotonic() > deadline:
            return not pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _namespace_pids(namespaces):
    """``{namespace: [pid, ...]}``: the live processes in each (what ``ip netns pids`` lists)."""
    ids = {}
    for ns in namespaces:
        with contextlib.suppress(OSError):
            st = os.stat(f'/run/netns/{ns}')
            ids[(st.st_dev, st.st_ino)] = ns
    found = {}
    if not ids:
        return found
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                st = os.stat(f'/proc/{entry}/ns/net')
            except OSError:  # gone, or a zombie
                continue
            ns = ids.get((st.st_dev, st.st_ino))
            if ns is not None:
                found.setdefault(ns, []).append(int(entry))
    return found


def _taken_subnets():
    """The K of every 198.18.K.0/24 in use: registered, in a name, holding an address or a route."""
    taken = set()
    for entry in os.listdir(REGISTRY):
        m = re.match(rf'^{_PREFIX}(\d+)\.json$', entry)
        if m:
            taken.add(int(m.group(1)))
    for name in _netns_list() + _link_names():
        m = _NAME.match(name)
        if m:
            taken.add(int(m.group(1)))

    def take(net):
        if not net.overlaps(RANGE):
            return
        for k in range(1, 255):
            if net.overlaps(ipaddress.ip_network(f'198.18.{k}.0/24')):
                taken.add(k)

    for line in _check(['ip', '-4', '-o', 'addr', 'show']).splitlines():
        m = re.search(r'\binet (\S+)', line)
        if m:
            address = ipaddress.ip_interface(m.group(1))
            take(ipaddress.ip_network(address.ip))  # the address itself
            if address.network.prefixlen >= 24:  # and a subnet as specific as a cluster's
                take(address.network)
    for line in _check(['ip', '-4', '-o', 'route', 'show', 'table', 'all']).splitlines():
        words = [w for w in line.split() if w not in _ROUTE_TYPES]
        with contextlib.suppress(ValueError, IndexError):
            net = ipaddress.ip_network(words[0], strict=False)
            if net.prefixlen >= 24:  # wider routes are less specific than a cluster's /24
                take(net)
    return taken


def _netns_list():
    try:
        return sorted(os.listdir('/run/netns'))
    except OSError:
        return []


def _link_names():
    names = []
    for line in _run(['ip', '-o', 'link', 'show']).stdout.splitlines():
        m = re.match(r'^\d+:\s+([^:@\s]+)', line)
        if m:
            names.append(m.group(1))
    return names


def _start_time(pid):
    """The start time (clock ticks after boot) of live process ``pid``; None if gone or a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ('Z', 'X') else int(fields[19])


# -- small helpers ------------------------------------------------------------------------------------

def _run(argv, **kw):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 1, '', str(e))


def _check(argv):
    """Run ``argv``; its stdout, or ClusterError naming the command and its last line of stderr."""
    done = _run(argv)
    if done.returncode:
        raise ClusterError(f'`{" ".join(argv)}` failed: {_last_line(done.stderr) or f"status {done.returncode}"}')
    return done.stdout


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


def _listens(pid, host, port):
    """Whether a TCP socket listens on ``host:port`` in the network namespace of process ``pid``.

    Read from its /proc/<pid>/net/tcp, without connecting (a connection would
    leave sshd a child for a while, and a line in its log).
    """
    wanted = '%08X:%04X' % (struct.unpack('=I', socket.inet_aton(host))[0], port)
    try:
        with open(f'/proc/{pid}/net/tcp') as f:
            next(f)
            return any(fields[1] == wanted and fields[3] == '0A' for fields in map(str.split, f))
    except (OSError, StopIteration):
        return False


def _last_line(text):
    lines = [line.strip() for line in (text or '').splitlines() if line.strip()]
    return lines[-1] if lines else ''


def _read(path):
    return reading.read_text(path, 1 << 20, 'cluster file')


def _write(path, text):
    with output.atomic_write(path, 'w', follow_links=False) as f:
        f.write(text)


def _check_own_key(key):
    """Refuse a key pair at ``key`` that is not one an earlier cluster left in the same folder
    (its public half carries the cluster comment): a key of anyone else is never replaced."""
    if not os.path.lexists(key) and not os.path.lexists(key + '.pub'):
        return
    try:
        ours = ' gluon-multigpu ' in reading.read_text(key + '.pub', 1 << 16, 'key')
    except (OSError, GluonMultiGPUError):
        ours = False
    if not ours:
        raise ClusterError(f'{key} is a key that is not a cluster key; it is left as it is: '
                           'give the cluster another workdir')


def _sshd_config(host, port, host_key, authorized):
    """The sshd configuration of the host at ``host``."""
    return '\n'.join([
        f'ListenAddress {host}:{port}',
        f'HostKey {host_key}',
        f'AuthorizedKeysFile {authorized}',
        'PermitRootLogin prohibit-password',
        'PubkeyAuthentication yes',
        'PasswordAuthentication no',
        'KbdInteractiveAuthentication no',
        'UsePAM no',
        'StrictModes no',
        'PidFile none',
        'MaxStartups 200',
        'MaxSessions 200',
        'AcceptEnv none',
        'PrintMotd no',
        'PrintLastLog no',
        'UseDNS no',
        'X11Forwarding no',
        ''])


def _ssh_config(identity, port, known):
    """The ssh client configuration of the cluster's hosts."""
    return '\n'.join([
        'Host *',
        '    User root',
        f'    IdentityFile {identity}',
        '    IdentitiesOnly yes',
        f'    Port {port}',
        f'    UserKnownHostsFile {known}',
        '    GlobalKnownHostsFile /dev/null',
        '    StrictHostKeyChecking yes',
        '    UpdateHostKeys no',
        '    BatchMode yes',
        '    LogLevel ERROR',
        '    ConnectTimeout 5',
        # a third of a second less per connection than the default post-quantum exchange
        '    KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org',
        ''])


def _sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


if __name__ == '__main__':
    # python -m gluon_multigpu.multihost.cluster: remove the clusters of processes that died unclosed
    ok, why = available()
    if not ok:
        sys.exit(f'cluster: {why}')
    gone = remove_stale()
    print(f'removed {len(gone)} stale cluster(s){": " + ", ".join(gone) if gone else ""}')

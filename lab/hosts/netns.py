"""A cluster's network: namespaces joined by veths to a bridge, the rule that keeps it here, tc.

The ``ip`` and ``tc`` commands that make a cluster's network, cut and shape
its links, and remove it again; what the machine has of it (namespaces,
links, addresses and routes of 198.18.0.0/15, the processes in a
namespace); and tc's rates (``rate_bytes``). ``cluster.Cluster`` uses them;
every name a cluster makes begins with ``<name>`` (``gmc<K>``): ``<name>br``
the bridge, ``<name>h<i>`` host i's namespace, ``<name>v<i>`` its veth.
"""
import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import time

__all__ = ['ClusterError', 'RANGE', 'RULE_PREF', 'HOST_IF', 'PREFIX', 'rate_bytes', 'run',
           'check', 'last_line', 'make', 'set_link', 'shape', 'unshape', 'remove',
           'kill_namespaces', 'namespace_pids', 'netns_list', 'link_names', 'taken_subnets']

#: The range every cluster's addresses come from: 198.18.K.0/24, K in 1..254.
RANGE = ipaddress.ip_network('198.18.0.0/15')
#: The preference of the routing rule that keeps a cluster's packets on this machine.
RULE_PREF = 1000
#: A host's interface inside its namespace.
HOST_IF = 'eth0'
#: tbf's queue: packets that would wait longer than this are dropped.
TBF_LATENCY = '50ms'
#: tbf's smallest bucket (bytes): several full-size (GSO) packets.
TBF_MIN_BURST = 64 * 1024
#: The start of every cluster's name (``gmc<K>``), and so of its namespaces and interfaces.
PREFIX = 'gmc'

_NAME = re.compile(rf'^{PREFIX}(\d+)(?:h\d+|v\d+|br)$')
_RATE = re.compile(r'^(\d+(?:\.\d*)?|\.\d+)([a-z]*)$', re.IGNORECASE)
_RATE_UNITS = {'': 1 / 8, 'bit': 1 / 8, 'bps': 1}
for _i, _p in enumerate('kmgt', 1):
    _RATE_UNITS.update({f'{_p}bit': 1000 ** _i / 8, f'{_p}bps': 1000 ** _i,
                        f'{_p}ibit': 1024 ** _i / 8, f'{_p}ibps': 1024 ** _i})
del _i, _p
_ROUTE_TYPES = {'unicast', 'local', 'broadcast', 'multicast', 'anycast', 'blackhole', 'unreachable',
                'prohibit', 'throw', 'nat'}
_CMD_TIMEOUT = 30  # seconds any one ip/tc/ssh-keygen command may take


class ClusterError(Exception):
    """A cluster could not be set up or changed; the message is one line."""


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


# -- running the commands ----------------------------------------------------------------------

def run(argv, **kw):
    """Run ``argv`` (text, captured, bounded in time); its ``CompletedProcess``, status 1 with
    the reason as stderr where it could not run."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 1, '', str(e))


def check(argv):
    """Run ``argv``; its stdout, or ClusterError naming the command and its last line of stderr."""
    done = run(argv)
    if done.returncode:
        raise ClusterError(f'`{" ".join(argv)}` failed: {last_line(done.stderr) or f"status {done.returncode}"}')
    return done.stdout


def last_line(text):
    """The last line of ``text`` that is not blank, stripped ('' if none)."""
    lines = [line.strip() for line in (text or '').splitlines() if line.strip()]
    return lines[-1] if lines else ''


# -- making and changing the network -----------------------------------------------------------

def make(bridge, gateway, prefix, namespaces, veths, hosts):
    """The bridge (``gateway``/``prefix``), the rule keeping packets here, and each host's
    namespace, veth and address, its default route via the bridge."""
    check(['ip', 'link', 'add', bridge, 'type', 'bridge'])
    check(['ip', 'addr', 'add', f'{gateway}/{prefix}', 'dev', bridge])
    check(['ip', 'link', 'set', bridge, 'up'])
    check(['ip', 'rule', 'add', 'pref', str(RULE_PREF), 'iif', bridge, 'unreachable'])
    for ns, veth, host in zip(namespaces, veths, hosts):
        check(['ip', 'netns', 'add', ns])
        check(['ip', 'link', 'add', veth, 'type', 'veth', 'peer', 'name', HOST_IF, 'netns', ns])
        check(['ip', 'link', 'set', veth, 'master', bridge, 'up'])
        check(['ip', '-n', ns, 'link', 'set', 'lo', 'up'])
        check(['ip', '-n', ns, 'addr', 'add', f'{host}/{prefix}', 'dev', HOST_IF])
        check(['ip', '-n', ns, 'link', 'set', HOST_IF, 'up'])
        check(['ip', '-n', ns, 'route', 'add', 'default', 'via', gateway])


def set_link(namespace, veth, up):
    """Both ends of a host's veth up (``up``) or down; addresses and routes stay."""
    if up:
        check(['ip', '-n', namespace, 'link', 'set', HOST_IF, 'up'])
        check(['ip', 'link', 'set', veth, 'up'])
    else:
        check(['ip', 'link', 'set', veth, 'down'])
        check(['ip', '-n', namespace, 'link', 'set', HOST_IF, 'down'])


def shape(namespace, veth, rate):
    """A token bucket filter at ``rate`` on both ends of a host's veth, replacing any before.

    Its bucket holds 1/250 s of the rate (at least ``TBF_MIN_BURST``), so
    that 1 Gbit/s is reached; packets that would wait more than
    ``TBF_LATENCY`` are dropped.
    """
    burst = str(max(TBF_MIN_BURST, int(rate_bytes(rate) / 250)))
    tbf = ['qdisc', 'replace', 'dev', None, 'root', 'tbf', 'rate', str(rate).strip(), 'burst', burst,
           'latency', TBF_LATENCY]
    for prefix, dev in ((['tc', '-n', namespace], HOST_IF), (['tc'], veth)):
        tbf[3] = dev
        check(prefix + tbf)


def unshape(namespace, veth):
    """Remove a host's shaping (both ends of its veth); nothing if it has none."""
    for prefix, dev in ((['tc', '-n', namespace], HOST_IF), (['tc'], veth)):
        run(prefix + ['qdisc', 'del', 'dev', dev, 'root'])


def remove(name, bridge=None, namespaces=(), veths=()):
    """Kill the processes of cluster ``name``'s namespaces; delete them, its veths, bridge and rule.

    Whatever of them exists: by the names given and by every name of the
    form ``<name>h<i>``, ``<name>v<i>``, ``<name>br`` found. Never raises.
    """
    try:
        def ours(n):
            m = _NAME.match(n)
            return m is not None and f'{PREFIX}{m.group(1)}' == name

        namespaces = sorted(set(namespaces) | {n for n in netns_list() if ours(n)})
        links = link_names()
        veths = sorted(set(veths) | {n for n in links if ours(n) and n != f'{name}br'})
        bridge = bridge or f'{name}br'
        kill_namespaces(namespaces)
        for veth in veths:  # both ends go at once (the host's end would go with its namespace, later)
            if veth in links:
                run(['ip', 'link', 'del', veth])
        for ns in namespaces:
            run(['ip', 'netns', 'del', ns])
        if bridge in links:
            run(['ip', 'link', 'del', bridge])
        for _ in range(8):  # one rule each, unless setup was repeated
            if run(['ip', 'rule', 'del', 'pref', str(RULE_PREF), 'iif', bridge, 'unreachable']).returncode:
                break
    except Exception:  # pylint: disable=broad-except
        pass


# -- what the machine has -----------------------------------------------------------------------

def kill_namespaces(namespaces, timeout=5.0):
    """SIGKILL every process in ``namespaces`` until none is left (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for found in namespace_pids(namespaces).values() for p in found]
        if not pids or time.monotonic() > deadline:
            return not pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def namespace_pids(namespaces):
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


def taken_subnets(registered=()):
    """The K of every 198.18.K.0/24 in use: ``registered``, in a name, holding an address or a
    route."""
    taken = set(registered)
    for name in netns_list() + link_names():
        m = _NAME.match(name)
        if m:
            taken.add(int(m.group(1)))

    def take(net):
        if not net.overlaps(RANGE):
            return
        for k in range(1, 255):
            if net.overlaps(ipaddress.ip_network(f'198.18.{k}.0/24')):
                taken.add(k)

    for line in check(['ip', '-4', '-o', 'addr', 'show']).splitlines():
        m = re.search(r'\binet (\S+)', line)
        if m:
            address = ipaddress.ip_interface(m.group(1))
            take(ipaddress.ip_network(address.ip))  # the address itself
            if address.network.prefixlen >= 24:  # and a subnet as specific as a cluster's
                take(address.network)
    for line in check(['ip', '-4', '-o', 'route', 'show', 'table', 'all']).splitlines():
        words = [w for w in line.split() if w not in _ROUTE_TYPES]
        with contextlib.suppress(ValueError, IndexError):
            net = ipaddress.ip_network(words[0], strict=False)
            if net.prefixlen >= 24:  # wider routes are less specific than a cluster's /24
                take(net)
    return taken


def netns_list():
    """The names of the machine's network namespaces (``/run/netns``)."""
    try:
        return sorted(os.listdir('/run/netns'))
    except OSError:
        return []


def link_names():
    """The names of the root namespace's links."""
    names = []
    for line in run(['ip', '-o', 'link', 'show']).stdout.splitlines():
        m = re.match(r'^\d+:\s+([^:@\s]+)', line)
        if m:
            names.append(m.group(1))
    return names

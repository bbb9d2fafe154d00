"""A cluster's OpenSSH side: its keys and configurations, and an sshd in each host's namespace.

``write_files`` makes a cluster's host key and login key (``ssh-keygen``),
the sshd configuration of each host, the client configuration and known
hosts that log into each as root with no prompt, the host file, and an
``ssh`` wrapper that uses them; ``start`` runs one sshd in each namespace
and waits until it listens.
"""
import os
import shutil
import socket
import struct
import subprocess
import time
from collections import namedtuple

from lab.hosts.netns import ClusterError, check
from gluon_multigpu.errors import GluonMultiGPUError
from gluon_multigpu.base import engine
from gluon_multigpu.filesafety import reading
from gluon_multigpu.filesafety import output

__all__ = ['SSHD', 'PRIVSEP_DIR', 'Files', 'write_files', 'start', 'log_path']

SSHD = '/usr/sbin/sshd'
#: The privilege separation directory sshd needs.
PRIVSEP_DIR = '/run/sshd'
_WAIT_SSHD = 10.0  # seconds each sshd has to listen

#: What ``write_files`` made: the login key, the host file, the client configuration, each
#: host's sshd configuration, the ssh program the wrapper runs, and the wrapper's folder.
Files = namedtuple('Files', 'identity hostfile ssh_config sshd_configs ssh bin_dir')


def write_files(workdir, name, hosts, ssh_port, host_cores):
    """Keys, sshd and ssh configurations, known hosts, hostfile, the ``ssh`` wrapper; ``Files``.

    The keys and files are made in a staging folder and moved into ``workdir`` together
    (``output.ReportSet``): a failure or kill leaves the previous cluster's set as it was,
    or the new one complete, never old keys gone before the new ones exist.
    """
    w = workdir
    host_key, identity = os.path.join(w, 'ssh_host_ed25519_key'), os.path.join(w, 'id_ed25519')
    for key in (host_key, identity):
        _check_own_key(key)
    authorized, known = os.path.join(w, 'authorized_keys'), os.path.join(w, 'known_hosts')
    hostfile, ssh_config = os.path.join(w, 'hostfile'), os.path.join(w, 'ssh_config')
    sshd_configs = [os.path.join(w, f'sshd_config-{i}') for i in range(len(hosts))]
    with output.ReportSet(w) as staged:
        def at(path):
            return staged.path(os.path.basename(path))
        for key in (host_key, identity):
            at(key + '.pub')  # ssh-keygen writes it beside the key: moved in with it
            check(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', f'gluon-multigpu {name}',
                   '-f', at(key)])
        host_pub = _read(at(host_key + '.pub')).split()[:2]
        _write(at(authorized), _read(at(identity + '.pub')))
        _write(at(known), ''.join(f'{h if ssh_port == 22 else f"[{h}]:{ssh_port}"} {" ".join(host_pub)}\n'
                                  for h in hosts))
        _write(at(hostfile), ''.join(h + '\n' for h in hosts))
        for path, host in zip(sshd_configs, hosts):
            _write(at(path), _sshd_config(host, ssh_port, host_key, authorized, host_cores))
        _write(at(ssh_config), _ssh_config(identity, ssh_port, known))
    # /usr/bin/ssh, not the first on PATH: that may be another cluster's wrapper (a cluster made under env())
    ssh = '/usr/bin/ssh' if os.access('/usr/bin/ssh', os.X_OK) else shutil.which('ssh')
    bin_dir = os.path.join(w, 'bin')
    output.makedirs(bin_dir)
    wrapper = os.path.join(bin_dir, 'ssh')
    _write(wrapper, f'#!/bin/sh\nexec {_sh_quote(ssh)} -F {_sh_quote(ssh_config)} "$@"\n')
    os.chmod(wrapper, 0o755)
    return Files(identity, hostfile, ssh_config, sshd_configs, ssh, bin_dir)


def start(sshds, namespaces, hosts, port, configs, workdir):
    """Start one sshd in each namespace (into ``sshds``, by host index: each one there as soon
    as it runs); wait until each listens on its address. Raises ``ClusterError``."""
    output.makedirs(PRIVSEP_DIR, mode=0o755)
    for i, ns in enumerate(namespaces):
        with open(log_path(workdir, i), 'ab') as log:  # sshd appends its log (a file of this cluster's own workdir)
            sshds[i] = subprocess.Popen(
                ['ip', 'netns', 'exec', ns, SSHD, '-D', '-e', '-f', configs[i]],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + _WAIT_SSHD
    for i, host in enumerate(hosts):
        while not _listens(sshds[i].pid, host, port):
            if sshds[i].poll() is not None:
                raise ClusterError(f'the sshd of host {i} ({host}) ended with status '
                                   f'{sshds[i].returncode}: {_log_tail(workdir, i)}')
            if time.monotonic() > deadline:
                raise ClusterError(f'the sshd of host {i} ({host}) did not listen on port {port} '
                                   f'within {_WAIT_SSHD:g} s: {_log_tail(workdir, i)}')
            time.sleep(0.02)


def log_path(workdir, i):
    """Where the sshd of host ``i`` writes its log."""
    return os.path.join(workdir, f'sshd-{i}.log')


def _log_tail(workdir, i, lines=3):
    try:
        tail = [line.strip() for line in _read(log_path(workdir, i)).splitlines() if line.strip()]
    except OSError:
        tail = []
    return ' | '.join(tail[-lines:]) or '(its log is empty)'


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


def _sshd_config(host, port, host_key, authorized, host_cores):
    """The sshd configuration of the host at ``host``, whose sessions are told that the host has
    ``host_cores`` cores (``base.engine.HOST_CORES``: the hosts share this machine's)."""
    return '\n'.join([
        f'SetEnv {engine.HOST_CORES}={host_cores}',
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

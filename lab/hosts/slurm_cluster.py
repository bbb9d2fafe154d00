"""A real Slurm on a cluster of network namespaces: munge, a controller, and a slurmd per host.

For tests of the launcher's ``slurm`` placement and of ``sbatch`` jobs
without a Slurm installation of several machines. Given a ``Cluster``
(``cluster.py``), ``SlurmCluster`` starts

In lab/NOTES.md, under this module's name.
"""
import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time

from lab.hosts import registry
from lab.hosts.netns import ClusterError
from gluon_multigpu.base import engine, signals
from gluon_multigpu.filesafety import fs
from gluon_multigpu.filesafety import output

__all__ = ['SLURMCTLD', 'SLURMD', 'MUNGED', 'CLIENTS', 'available', 'SlurmCluster', 'remove_stale']

SLURMCTLD, SLURMD, MUNGED = '/usr/sbin/slurmctld', '/usr/sbin/slurmd', '/usr/sbin/munged'
#: The client programs a Slurm user runs.
CLIENTS = ('srun', 'sbatch', 'salloc', 'sinfo', 'squeue', 'scontrol', 'scancel')
#: Seconds a node may go unheard before the controller takes it as down (Slurm's SlurmdTimeout).
SLURMD_TIMEOUT = 10
#: Seconds a job step's credential lasts, and so the least a requeued job waits before it runs
#: again (Slurm's default: 120).
CRED_EXPIRE = 10
_START_WAIT = 30.0  # seconds the daemons have to start and the nodes to become idle
_FOLDER = 'slurm'   # the Slurm's folder in the cluster's workdir


def available():
    """``(True, '')`` where a Slurm can be started here, else ``(False, reason)``; changes
    nothing."""
    if os.geteuid() != 0:
        return False, f'the Slurm daemons run as root here (this process runs as uid {os.geteuid()})'
    for path in (SLURMCTLD, SLURMD, MUNGED):
        if not os.access(path, os.X_OK):
            return False, (f'no {path}: install the packages slurmctld slurmd slurm-client munge '
                           '(apt-get install)')
    for tool in CLIENTS + ('nsenter',):
        if not shutil.which(tool):
            return False, f'no `{tool}` on PATH (the package slurm-client or util-linux)'
    return True, ''


class SlurmCluster:
    """Slurm on ``cluster``'s hosts: node ``n<i>`` is host ``i``; a context manager.

    ``nodes`` (the node names), ``addresses`` (``{node: address}``),
    ``conf`` (``slurm.conf``), ``folder`` (everything of it), ``port`` (the
    controller's), ``partition``. Setup that fails ends what it started and
    raises ``ClusterError``.
    """

    partition = 'main'

    def __init__(self, cluster, *, cpus=None):
        ok, reason = available()
        if not ok:
            raise ClusterError(f'cannot start Slurm here: {reason}')
        self.cluster = cluster
        self.nodes = [f'n{i}' for i in range(len(cluster.hosts))]
        self.addresses = dict(zip(self.nodes, cluster.hosts))
        self.folder = os.path.join(cluster.workdir, _FOLDER)
        self.conf = os.path.join(self.folder, 'slurm.conf')
        self.socket = os.path.join(self.folder, 'munge.socket')
        self.cpus = cpus or os.cpu_count() or 1
        self.port = None
        self._procs, self._closed, self._creator = {}, False, os.getpid()
        atexit.register(self._close_at_exit)
        try:
            remove_stale()
            if os.path.lexists(self.folder):  # an earlier Slurm's of this workdir: ours by name
                fs.remove_tree(self.folder)
            output.makedirs(os.path.join(self.folder, 'state'), mode=0o700)
            self.port = _free_port()
            self._write_files()
            self._start_daemons()
            self._await_idle()
        except BaseException as e:
            self.close()
            if isinstance(e, ClusterError) or not isinstance(e, Exception):
                raise
            raise ClusterError(f'Slurm setup failed: {type(e).__name__}: {e}') from e

    # -- setup -------------------------------------------------------------------------------------

    def _write_files(self):
        """The munge key (fresh, private) and ``slurm.conf``."""
        output.create_exclusive(self.path('munge.key'), secrets.token_bytes(1024), 0o600)
        output.create_exclusive(self.conf, self._config().encode(), 0o644)

    def _config(self):
        """The text of ``slurm.conf``."""
        f = self.folder
        lines = [
            f'ClusterName={self.cluster.name}',
            f'SlurmctldHost={socket.gethostname()}({self.cluster.gateway})',
            f'SlurmctldPort={self.port}', 'SlurmdPort=6818',
            'SlurmUser=root', 'SlurmdUser=root',
            'AuthType=auth/munge', 'CredType=cred/munge',
            f'AuthInfo=socket={self.socket},cred_expire={CRED_EXPIRE}',
            f'StateSaveLocation={f}/state', f'SlurmdSpoolDir={f}/spool-%n',
            f'SlurmctldPidFile={f}/slurmctld.pid', f'SlurmdPidFile={f}/slurmd-%n.pid',
            f'SlurmctldLogFile={f}/slurmctld.log', f'SlurmdLogFile={f}/slurmd-%n.log',
            'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none',
            'JobAcctGatherType=jobacct_gather/none',
            'AccountingStorageType=accounting_storage/none',
            'JobCompType=jobcomp/none', 'MpiDefault=none', 'SwitchType=switch/none',
            'SchedulerType=sched/backfill', 'SchedulerParameters=bf_interval=1,sched_interval=2',
            'SelectType=select/linear',
            'ReturnToService=2', f'SlurmdTimeout={SLURMD_TIMEOUT}', 'InactiveLimit=0',
            'KillWait=5', 'MinJobAge=600', 'JobRequeue=1', 'PlugStackConfig=/dev/null',
        ]
        lines += [f'NodeName={n} NodeAddr={a} CPUs={self.cpus} State=UNKNOWN'
                  for n, a in self.addresses.items()]
        lines.append(f'PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE '
                     'State=UP')
        return '\n'.join(lines) + '\n'

    def _start_daemons(self):
        """munged, then slurmctld, then a slurmd per host, each in the foreground, as our child."""
        key, socket_path = self.path('munge.key'), self.socket
        self._spawn('munged', [MUNGED, '-F', '--force', f'--key-file={key}',
                               f'--socket={socket_path}',
                               f'--pid-file={self.path("munged.pid")}',
                               f'--log-file={self.path("munged.log")}',
                               f'--seed-file={self.path("munged.seed")}'])
        self._await(lambda: os.path.exists(socket_path), 'munged', 'its socket')
        self._spawn('slurmctld', [SLURMCTLD, '-D', '-c', '-f', self.conf])
        for i, node in enumerate(self.nodes):
            self._spawn(node, ['nsenter', f'--net=/run/netns/{self.cluster.namespaces[i]}',
                               SLURMD, '-D', '-N', node, '-f', self.conf])

    def _spawn(self, name, argv):
        with open(self.path(f'{name}.out'), 'ab') as log:  # a file of our own folder
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env(),
                start_new_session=True, preexec_fn=lambda: signals.on_parent_death(signal.SIGKILL))

    def _await(self, ready, name, what, wait=_START_WAIT):
        deadline = time.monotonic() + wait
        while not ready():
            for daemon, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f'{daemon} ended with status {proc.returncode}: '
                                       f'{self._log_tail(daemon)}')
            if time.monotonic() > deadline:
                raise ClusterError(f'{name} did not have {what} within {wait:g} s: '
                                   f'{self._log_tail(name)}')
            time.sleep(0.05)

    def _await_idle(self):
        """Wait until ``sinfo`` shows every node idle."""
        self._await(lambda: self.states() == {n: 'idle' for n in self.nodes},
                    'slurmctld', 'every node idle')

    # -- use ---------------------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f'<SlurmCluster {self.cluster.name} port {self.port}: {", ".join(self.nodes)}>'

    def path(self, name):
        """The file ``name`` of the Slurm's folder."""
        return os.path.join(self.folder, name)

    def env(self, environ=None):
        """``cluster.env(environ)`` with ``SLURM_CONF`` naming this Slurm's configuration, and no
        ``SLURM_*`` variable of an allocation this process may run in. A job submitted with it
        (Slurm passes the submitter's variables to every step) is told each host's share of this
        machine's cores (``base.engine.HOST_CORES``), as the hosts' sshd tells their sessions."""
        env = {k: v for k, v in self.cluster.env(environ).items()
               if not k.startswith(('SLURM_', 'SBATCH_', 'SALLOC_', 'SRUN_'))}
        env['SLURM_CONF'] = self.conf
        env[engine.HOST_CORES] = str(self.cluster.host_cores)
        return env

    def run(self, argv, **kw):
        """Run a Slurm client (``['srun', ...]``) with ``env()``: its ``CompletedProcess`` (text,
        captured; ``kw`` to ``subprocess.run``; a 60 s limit unless given)."""
        kw.setdefault('timeout', 60)
        kw.setdefault('stdin', subprocess.DEVNULL)
        return subprocess.run(argv, env=self.env(kw.pop('env', None)), capture_output=True,
                              text=True, **kw)

    def states(self):
        """``{node: state}`` as ``sinfo`` shows them (``idle``, ``alloc``, ``down*``, ...)."""
        try:
            done = self.run(['sinfo', '-h', '-N', '-o', '%N %t'], timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)

    def job_pids(self):
        """``{i: [pid, ...]}`` of the processes on host ``i`` that are neither its sshd listener
        nor its slurmd: the jobs' (their steps' slurmstepd and tasks), hosts with none left out."""
        daemons = {p.pid for p in self._procs.values()}
        found = {i: [p for p in pids if p not in daemons]
                 for i, pids in self.cluster.job_pids().items()}
        return {i: pids for i, pids in found.items() if pids}

    def log(self, name):
        """The text of a daemon's log (``slurmctld``, ``slurmd-n0``, ``munged``), '' if none."""
        try:
            with open(self.path(f'{name}.log'), errors='replace') as f:
                return f.read()
        except OSError:
            return ''

    def close(self):
        """End every process of this Slurm (the slurmds, slurmctld, munged, and every process
        left on the hosts but their sshd: the jobs' steps) and remove its folder. Safe to call
        more than once; never raises."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self._close_at_exit)
        with contextlib.suppress(Exception):
            self._end_processes()
        with contextlib.suppress(OSError):
            fs.remove_tree(self.folder)

    def _end_processes(self):
        """SIGTERM to the daemons (in reverse order of start), SIGKILL after 3 s; then every
        process left in the hosts' namespaces but their sshd (the jobs' steps, and anything
        else started there)."""
        procs = list(self._procs.values())[::-1]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for _ in range(50):
            left = [p for pids in self.cluster.job_pids().values() for p in pids]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def _close_at_exit(self):
        if os.getpid() == self._creator:
            self.close()

    def _log_tail(self, name, lines=3):
        """The last ``lines`` lines of a daemon's log and output, as one line."""
        log = f'slurmd-{name}' if name in self.nodes else name
        text = self.log(log)
        with contextlib.suppress(OSError), open(self.path(f'{name}.out'), errors='replace') as f:
            text += f.read()
        tail = [line.strip() for line in text.splitlines() if line.strip()]
        return ' | '.join(tail[-lines:]) or '(its log is empty)'


def remove_stale():
    """End munged and slurmctld processes whose folder (``<workdir>/slurm``) belongs to no live
    cluster; return their process ids. (The slurmds of a dead cluster go with its namespaces.)"""
    live = {os.path.join(w, _FOLDER) for w in registry.live_workdirs()}
    ended = []
    for pid, argv in _daemons():
        folder = next((m.group(1) for a in argv
                       for m in [re.search(r'(/\S*/' + _FOLDER + r')/[^/]+$', a)] if m), None)
        if folder and folder not in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
    return ended


def _daemons():
    """``(pid, argv)`` of every munged and slurmctld process running here."""
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            exe = os.readlink(f'/proc/{entry}/exe')
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                argv = f.read().decode(errors='replace').split('\0')
        except OSError:
            continue
        if exe in (MUNGED, SLURMCTLD):
            found.append((int(entry), argv))
    return found


def _free_port():
    """A TCP port free here now, outside the ephemeral range (which clients take from)."""
    for _ in range(200):
        port = 20000 + secrets.randbelow(10000)
        with socket.socket() as s:
            try:
                s.bind(('', port))
            except OSError:
                continue
            return port
    raise ClusterError('no free TCP port for slurmctld in 20000-29999')

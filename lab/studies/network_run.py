"""One run of the network study: the launcher on a cluster with shaped links, its step timed.

``measure`` shapes every link, runs ``network_model.launch_argv`` with the
cluster's ``env()`` and returns a ``Measurement``: seconds per step
(``step_seconds``: rank 0's timed epoch, from its ``--json`` or its epoch
line, ``parse_epochs``), and how much CPU the machine's other processes
used meanwhile (``OthersCPU``).
"""
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

from lab.hosts import cluster as _cluster
from lab.studies.network_model import SERVERS, TIMED_EPOCH, Config, estimate_seconds, launch_argv
from lab.studies.jobs import StudyError, stop_launcher
from gluon_multigpu.errors import GluonMultiGPUError
from gluon_multigpu.base import signals
from gluon_multigpu.filesafety import fs, reading
from gluon_multigpu.base.background import Background
from gluon_multigpu.filesafety import reading as _reading
from gluon_multigpu.filesafety.files import write_text

__all__ = ['parse_epochs', 'step_seconds', 'OthersCPU', 'others_cores', 'Measurement', 'measure']

#: An epoch line of a worker as the launcher relays it (rank 0's has no ``rank R:``).
_EPOCH = re.compile(r'^\[worker \d+@\S+ as rank (\d+)\] (?:rank \d+: )?epoch (\d+)/\d+: '
                    r'.*?(\d+(?:\.\d+)?) s, \d+ samples/s')


def parse_epochs(text):
    """``{rank: {epoch: seconds}}`` from the epoch lines in the launcher's output ``text``.

    A line reads ``[worker 1@198.18.7.5 as rank 0] epoch 2/2: loss ..., 19.9 s, 2
    samples/s, ...``; seconds are training seconds (evaluation excluded),
    to 0.1 s. Other lines are ignored.
    """
    epochs = {}
    for line in text.splitlines():
        m = _EPOCH.match(line)
        if m:
            epochs.setdefault(int(m.group(1)), {})[int(m.group(2))] = float(m.group(3))
    return epochs


def step_seconds(steps, text='', json_path=None, epoch=TIMED_EPOCH):
    """Seconds per step: rank 0's training seconds of ``epoch`` divided by ``steps``.

    From its ``--json`` file (full precision) when ``json_path`` holds the
    epoch, else from its epoch line in the launcher's output ``text``
    (0.1 s). None if neither has it.
    """
    if json_path:
        try:
            runs = reading.read_json(json_path, 64 << 20, 'the run\'s --json file')['runs']
            seconds = next(e['seconds'] for e in runs[0]['epochs'] if e['epoch'] == epoch)
            return seconds / steps
        except (OSError, ValueError, KeyError, IndexError, TypeError, StopIteration,
                GluonMultiGPUError):
            pass
    seconds = parse_epochs(text).get(0, {}).get(epoch)
    return None if seconds is None else seconds / steps


# -- what the machine's other processes do meanwhile -----------------------------------------------

_PF_KTHREAD = 0x00200000


class OthersCPU(Background):
    """The CPU time the machine's other processes use while the block runs; a context manager.

    Every ``interval`` seconds a thread (``work``) reads ``/proc/PID/stat`` of
    every process and adds up the user and system time that processes gained
    which are neither this process nor its descendants nor in one of
    ``namespaces`` (network namespaces by name, e.g. a cluster's). Kernel
    threads are left out: they also carry this study's network traffic. The
    block's entry takes the first sample, its exit the last. After the block,
    ``seconds`` is the others' CPU seconds, ``wall`` the block's seconds and
    ``cores`` their ratio (0 on an idle machine, up to the cores). Processes
    that start and end between two samples are missed.
    """

    thread_name = 'others-cpu'

    def __init__(self, namespaces=(), interval=0.25):
        self.namespaces, self.interval = list(namespaces), interval
        self.seconds = self.wall = self.cores = 0.0
        self._seen, self._start = {}, None
        self._tick = os.sysconf('SC_CLK_TCK')

    def __enter__(self):
        self._start = time.monotonic()
        self._sample(first=True)
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._sample()
        self.wall = time.monotonic() - self._start
        self.cores = self.seconds / self.wall if self.wall > 0 else 0.0
        return False

    def work(self):
        """Sample every ``interval`` seconds until the block ends."""
        while not self.finished.wait(self.interval):
            self._sample()

    def _namespace_ids(self):
        ids = set()
        for ns in self.namespaces:
            try:
                st = os.stat(f'/run/netns/{ns}')
                ids.add((st.st_dev, st.st_ino))
            except OSError:
                pass
        return ids

    def _sample(self, first=False):
        ours_ns = self._namespace_ids()
        procs = {}
        for entry in os.listdir('/proc'):
            if not entry.isdigit():
                continue
            try:
                with open(f'/proc/{entry}/stat') as f:
                    fields = f.read().rsplit(')', 1)[1].split()
                st = os.stat(f'/proc/{entry}/ns/net')
            except (OSError, IndexError):
                continue
            if int(fields[6]) & _PF_KTHREAD:
                continue
            procs[int(entry)] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]),
                                 (st.st_dev, st.st_ino) in ours_ns)
        ours = {os.getpid()}
        changed = True
        while changed:  # descendants of this process
            changed = False
            for pid, (ppid, *_) in procs.items():
                if ppid in ours and pid not in ours:
                    ours.add(pid)
                    changed = True
        for pid, (_, start, ticks, in_ns) in procs.items():
            if pid in ours or in_ns:
                continue
            key = (pid, start)
            before = self._seen.get(key, ticks if first else 0)
            self.seconds += max(0, ticks - before) / self._tick
            self._seen[key] = ticks


def others_cores(seconds=2.0):
    """Cores used over ``seconds`` by the processes other than this one and its descendants."""
    with OthersCPU() as watch:
        time.sleep(seconds)
    return watch.cores


# -- running a configuration on a cluster --------------------------------------------------------

@dataclass
class Measurement:
    """What one run gave: seconds per step (None if it failed) and how it went."""
    config: Config
    step_s: Optional[float]
    status: str              # 'ok', or why there is no step time
    wall_s: float
    others_cores: float
    load: float              # the 1-minute load average when it began
    epochs: dict             # parse_epochs of its output
    leftover: dict           # processes still on the hosts afterwards ({host index: pids})

    def to_dict(self):
        """Plain JSON-ready data."""
        return {'model': self.config.model, 'workers': self.config.workers,
                'bandwidth': self.config.bandwidth, 'batch': self.config.batch,
                'steps': self.config.steps, 'threads': self.config.threads,
                'step_s': self.step_s, 'status': self.status,
                'wall_s': self.wall_s, 'others_cores': self.others_cores, 'load': self.load,
                'epochs': {str(r): {str(e): s for e, s in es.items()}
                           for r, es in self.epochs.items()},
                'leftover': {str(h): p for h, p in self.leftover.items()}}


def _set_links(cl, bandwidth):
    for i in range(len(cl.hosts)):
        if bandwidth:
            cl.shape(i, bandwidth)
        else:
            cl.unshape(i)


def measure(cl, config, workdir, timeout=None, log=None):
    """Run ``config`` on cluster ``cl`` (``config.workers + 2`` hosts) through the launcher.

    Shapes every link to ``config.bandwidth`` (or unshapes it), runs
    ``launch_argv`` with the cluster's ``env()`` from the checkout (every host
    shares the filesystem) and returns a ``Measurement``. ``config.steps``
    must be set (``steps_for``). ``workdir`` takes rank 0's JSON; ``log`` (a
    path) gets the command and the launcher's whole output appended. Past
    ``timeout`` seconds (default: three times ``estimate_seconds``, plus a
    minute) the job is stopped and the status says so. Waits up to 10 s for
    the hosts to be empty of the job's processes; what is left is in
    ``leftover``. Ctrl-C stops the job (the cluster's ``close`` removes the rest).
    """
    if not config.steps:
        raise StudyError(f'{config.label}: no steps per epoch chosen (steps_for)')
    if len(cl.hosts) < config.workers + 1 + SERVERS:
        raise StudyError(f'{config.label}: needs {config.workers + 1 + SERVERS} hosts, the '
                         f'cluster has {len(cl.hosts)}')
    timeout = timeout or 3 * estimate_seconds(config) + 60
    _set_links(cl, config.bandwidth)
    json_path = os.path.join(workdir, f'{config.name}.json')
    if os.path.lexists(json_path):  # an earlier try's, in this study's own scratch folder
        fs.unlink(json_path)
    argv = launch_argv(config, cl.hostfile, json_path)
    load = os.getloadavg()[0]
    status = 'ok'
    with OthersCPU(cl.namespaces) as watch:
        proc = subprocess.Popen(argv, cwd=_cluster.checkout() or os.getcwd(), env=cl.env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=signals.dying_with_parent())
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_launcher(proc)
            out, _ = proc.communicate()
            status = f'timed out after {timeout:.0f} s'
        except BaseException:
            stop_launcher(proc)
            raise
    text = out.decode(errors='replace')
    if log:
        append_text(log, f'$ {shlex.join(argv)}\n{text}')
    if status == 'ok' and proc.returncode:
        last = [line for line in text.splitlines() if line.strip()][-1:] or ['no output']
        status = f'failed (status {proc.returncode}): {last[0].strip()}'
    step = step_seconds(config.steps, text, json_path) if status == 'ok' else None
    if status == 'ok' and step is None:
        status = 'no timed epoch in the output'
    return Measurement(config, step, status, watch.wall, watch.cores, load, parse_epochs(text),
                       _leftover(cl))


def _leftover(cl, wait=10.0):
    """The job's processes on the hosts (``cl.job_pids()``) once they are gone or ``wait`` s
    have passed."""
    deadline = time.monotonic() + wait
    leftover = cl.job_pids()
    while leftover and time.monotonic() < deadline:
        time.sleep(0.2)
        leftover = cl.job_pids()
    return leftover


#: The longest run log read back before a line is added to it.
LOG_LIMIT = 256 << 20


def append_text(path, text, limit=LOG_LIMIT):
    """Add ``text`` at the end of the log ``path`` (made if missing): the file is replaced
    atomically by its old content and ``text``, so that it is never left half-written."""
    try:
        old = _reading.read_text(path, limit, 'log file')
    except FileNotFoundError:
        old = ''
    write_text(path, old + text)

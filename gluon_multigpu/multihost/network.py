"""The parameter server's network model against a shaped network: steps measured and predicted.

``scaling.worker_projection`` predicts what the network adds to a step of
``dist_sync`` training with W workers and S servers on links of bandwidth B.
This study measures it: a ``cluster.Cluster`` of W + 2 hosts (scheduler,
one server, W workers, each on a host of its own, so that no two share a
link) runs ``scripts/launch.py --launcher ssh`` with ``scripts/train.py
--kvstore dist_sync --cpu-devices 1`` on random data of Fashion-MNIST's
shape (``--synthetic``), once with every link unshaped and once with every
link shaped (tbf, both directions) to each bandwidth.

The hosts are namespaces of one machine: all workers, the server and the
scheduler share its cores. The unshaped run measures what a step costs under
that sharing with a network that costs next to nothing, ``t_unshaped(W)``;
the prediction for a shaped run adds the model's network time to it::

    t_step(W, B) = t_unshaped(W) + t_net(W, B)

with ``t_net`` from ``scaling.worker_projection`` (one server), given the
model's gradient bytes G, its largest key L and the TCP payload of the
link's rate B (``PAYLOAD``): ``t_net(W) = (G + L) W / B``. Beside it: the
step if the network hid entirely behind the compute or the compute behind
the network, ``max(t_unshaped, t_net)``, and the model as it was before
this study, ``t_unshaped + 2 G W / rate`` (push, then pull).

Each worker runs with ``OMP_NUM_THREADS=1`` (``WORKER_THREADS``): with a
thread per core, W workers' 2W threads on two cores wait for each other,
and the unshaped step measures that contention rather than the compute.

A step's time is rank 0's training seconds of the second epoch (its
``--json``) divided by the epoch's steps: the first epoch also builds the
graph, creates the kvstore and sends every worker the initial weights.
Rank 0 evaluates between the epochs, on one test image, so that the other
workers' head start into the second epoch is a few milliseconds.

Every run also records how much CPU the machine's other processes used
meanwhile (``OthersCPU``): the unshaped runs are compute, and other work on
the same cores makes them slow; ``study`` measures a run again when others
used more than it allows.

This module runs subprocesses only: it loads neither MXNet nor NumPy.
"""
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import cluster as _cluster
from ..errors import GluonMultiGPUError
from ..base import fs, reading
from ..run.files import append_text
from ..study.scaling import worker_projection

__all__ = ['MODELS', 'GRAD_BYTES', 'LARGEST_KEY_BYTES', 'PAYLOAD', 'DEFAULT_BATCH',
           'DEFAULT_STEPS', 'TIMED_SECONDS', 'QUICK_STEPS', 'BANDWIDTHS', 'SERVERS',
           'TIMED_EPOCH', 'WORKER_THREADS', 'ROW_COLUMNS', 'StudyError', 'Config',
           'gradient_bytes', 'plan', 'steps_for', 'train_argv', 'launch_argv', 'parse_epochs',
           'step_seconds', 'predict', 'table_row', 'markdown_table', 'estimate_seconds',
           'OthersCPU', 'others_cores', 'Measurement', 'measure', 'study']

#: The networks of ``train.py``, in the study's order.
MODELS = ('resnet18', 'simple-cnn')
#: Bytes of each model's float32 gradients (4 x trainable parameters: 11,175,818 and 129,068),
#: what a worker pushes and pulls every step (``measure.gradient_bytes`` of the built network).
GRAD_BYTES = {'resnet18': 44_703_272, 'simple-cnn': 516_272}
#: Bytes of each model's largest key, the gradient of its largest parameter: ResNet-18's
#: 512 x 512 x 3 x 3 convolutions, the simple CNN's 128 x 800 dense layer.
LARGEST_KEY_BYTES = {'resnet18': 9_437_184, 'simple-cnn': 409_600}
#: The share of a tc rate that TCP carries as payload: tbf counts whole Ethernet frames, and
#: a full frame of 1514 bytes (MTU 1500) carries 1448 (IPv4 and TCP headers with
#: timestamps: 52 bytes, Ethernet: 14). Measured on the cluster's links: 95.5-95.7%.
PAYLOAD = 1448 / 1514
#: Samples per worker per step: ResNet-18's step of 2-3 workers on two cores takes 0.5-0.8 s.
DEFAULT_BATCH = {'resnet18': 16, 'simple-cnn': 64}
#: The fewest steps per epoch (two epochs run, the second is timed): ResNet-18 at 100 Mbit/s
#: takes 5-17 s a step.
DEFAULT_STEPS = {'resnet18': 3, 'simple-cnn': 100}
#: Seconds the timed epoch should last at least: runs whose steps are short get more of them.
TIMED_SECONDS = 6.0
#: Steps per epoch with ``--quick``.
QUICK_STEPS = 5
#: The link rates of the study (tc rates).
BANDWIDTHS = ('100mbit', '1gbit')
#: Parameter servers: one, on a host of its own.
SERVERS = 1
#: The epoch whose steps are timed; the run has this many.
TIMED_EPOCH = 2
#: OpenMP threads of each worker (``OMP_NUM_THREADS``): the hosts share this machine's cores,
#: and a worker with a thread per core (the package's choice for one CPU context) puts 2W
#: threads of W workers on two cores, whose waits for each other make a step's CPU time
#: erratic (docs/distributed.md, "The model against a shaped network").
WORKER_THREADS = 1
#: Test images rank 0 evaluates after each epoch (the fewest train.py takes).
NUM_TEST = 1
#: Seconds a run takes besides its steps: cluster, ssh, the launcher's checks, five
#: processes loading MXNet on shared cores (for ``estimate_seconds``).
STARTUP_S = 5.0
#: Core-seconds of one sample's training step on this kind of machine, a guess for
#: ``estimate_seconds`` until the unshaped run has measured it.
COMPUTE_GUESS_S = {'resnet18': 0.035, 'simple-cnn': 0.0005}

#: The columns of a row of the table (``table_row``), in order.
ROW_COLUMNS = ['model', 'workers', 'bandwidth', 'batch', 'steps', 'grad_bytes',
               'largest_key_bytes', 'unshaped_s', 't_net_s', 'predicted_s', 'measured_s', 'ratio',
               'overlapped_s', 't_net_old_s', 'predicted_old_s', 'ratio_old', 'others_cores',
               'status']


class StudyError(Exception):
    """The study cannot run here, or a run could not be made: one line."""


@dataclass(frozen=True)
class Config:
    """One run of the study: a model, W workers, every link at ``bandwidth`` (None: unshaped).

    ``steps`` per epoch; None until ``steps_for`` has chosen them. ``threads``:
    each worker's ``OMP_NUM_THREADS``; 0 leaves it to the package (a thread
    per core).
    """
    model: str
    workers: int
    bandwidth: Optional[str]
    batch: int
    steps: Optional[int]
    threads: int = WORKER_THREADS

    @property
    def num_train(self):
        """Training images: ``steps`` global batches of ``batch`` per worker."""
        return self.batch * self.workers * self.steps

    @property
    def label(self):
        """E.g. ``resnet18, 2 workers, 100mbit`` (``unshaped`` without a bandwidth)."""
        return f'{self.model}, {self.workers} workers, {self.bandwidth or "unshaped"}'

    @property
    def name(self):
        """E.g. ``resnet18-2w-100mbit``: the run's log file is ``<name>.log``."""
        return f'{self.model}-{self.workers}w-{self.bandwidth or "unshaped"}'


def gradient_bytes(model):
    """The bytes of ``model``'s gradients, what one worker pushes (and pulls back) every step."""
    try:
        return GRAD_BYTES[model]
    except KeyError:
        raise StudyError(f'unknown model {model!r}; choose one of {", ".join(MODELS)}') from None


def plan(models, workers, bandwidths, batch=None, steps=None, threads=WORKER_THREADS):
    """The runs of the study, in the order they run: ``{W: [Config, ...]}``.

    One cluster per worker count; on it, per model, the unshaped run first
    (the predictions need it), then one run per bandwidth. ``batch`` (None:
    ``DEFAULT_BATCH`` of each model) is per worker; ``steps`` per epoch
    (None: ``steps_for`` chooses them when the run comes); ``threads`` as
    ``Config``'s.
    """
    runs = {}
    for w in workers:
        runs[w] = [Config(m, w, bw, batch or DEFAULT_BATCH[m], steps, threads)
                   for m in models for bw in (None, *bandwidths)]
    return runs


def steps_for(config, unshaped_s=None, cores=None):
    """Steps per epoch for ``config``: its own, else enough for a timed epoch of ``TIMED_SECONDS``.

    By the step ``estimate_seconds`` expects (``unshaped_s`` and ``cores`` as
    there), and at least ``DEFAULT_STEPS`` of its model.
    """
    if config.steps:
        return config.steps
    step = _step_estimate(config, unshaped_s, cores)
    return max(DEFAULT_STEPS[config.model], math.ceil(TIMED_SECONDS / step))


# -- one run ---------------------------------------------------------------------------------------

def train_argv(config, json_path):
    """What every worker runs: ``train.py --kvstore dist_sync`` on one CPU context, random data.

    Two epochs of ``config.steps`` steps; rank 0 writes its figures to
    ``json_path``. With ``config.threads``, under ``env OMP_NUM_THREADS=N``.
    """
    env = [shutil.which('env') or '/usr/bin/env', f'OMP_NUM_THREADS={config.threads}']
    return [*(env if config.threads else []), *_cluster.program('train'),
            '--kvstore', 'dist_sync', '--cpu-devices', '1',
            '--model', config.model, '--synthetic', '--batch-size', str(config.batch),
            '--num-train', str(config.num_train), '--num-test', str(NUM_TEST),
            '--num-epochs', str(TIMED_EPOCH), '--progress-interval', '0', '--json', json_path]


def launch_argv(config, hostfile, json_path):
    """The launcher's command: ``config.workers`` workers, one server, over ssh to ``hostfile``."""
    return [*_cluster.program('launch'), '-n', str(config.workers), '-s', str(SERVERS),
            '--launcher', 'ssh', '-H', hostfile, '--', *train_argv(config, json_path)]


#: An epoch line of a worker as the launcher relays it (rank 0's has no ``rank R:``).
_EPOCH = re.compile(r'^\[worker \d+@\S+ rank (\d+)\] (?:rank \d+: )?epoch (\d+)/\d+: '
                    r'.*?(\d+(?:\.\d+)?) s, \d+ samples/s')


def parse_epochs(text):
    """``{rank: {epoch: seconds}}`` from the epoch lines in the launcher's output ``text``.

    A line reads ``[worker 1@198.18.7.5 rank 0] epoch 2/2: loss ..., 19.9 s, 2
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


# -- the prediction and the table ----------------------------------------------------------------

def predict(unshaped_s, model, workers, bandwidth, old=False):
    """``scaling.worker_projection``'s row for ``model`` on W workers, one server, at ``bandwidth``.

    ``unshaped_s`` is the step without the network: ``t_step_s = unshaped_s +
    t_net_s``, ``t_step_min_s = max(unshaped_s, t_net_s)``. The model's
    gradient bytes and largest key, at the TCP payload of the tc rate
    ``bandwidth`` (``PAYLOAD`` x its bytes per second: 100mbit carries
    11.96e6 bytes/s). ``old``: the model as it was before this study, the
    push and then the pull of all the gradients, at the tc rate itself.
    """
    rate = _cluster.rate_bytes(bandwidth)
    if old:
        return worker_projection(unshaped_s, gradient_bytes(model), [workers], SERVERS,
                                 rate / 1e9)[0]
    return worker_projection(unshaped_s, gradient_bytes(model), [workers], SERVERS,
                             PAYLOAD * rate / 1e9, largest_bytes=LARGEST_KEY_BYTES[model])[0]


def table_row(config, unshaped_s, measured_s, others_cores=None, status='ok'):
    """One row of the table: a shaped run's measured step beside the predictions.

    ``predicted_s`` is ``unshaped_s + t_net_s`` and ``ratio`` measured /
    predicted; ``overlapped_s`` is ``max(unshaped_s, t_net_s)``, the step if
    the network hid entirely behind the compute or the compute behind the
    network; ``*_old`` the same against the model as it was before
    (``predict``'s ``old``). Figures that need a time that is missing (None)
    are None.
    """
    row = dict.fromkeys(ROW_COLUMNS)
    row.update(model=config.model, workers=config.workers, bandwidth=config.bandwidth,
               batch=config.batch, steps=config.steps, grad_bytes=gradient_bytes(config.model),
               largest_key_bytes=LARGEST_KEY_BYTES[config.model], unshaped_s=unshaped_s,
               measured_s=measured_s, others_cores=others_cores, status=status)
    if unshaped_s is not None:
        new = predict(unshaped_s, config.model, config.workers, config.bandwidth)
        old = predict(unshaped_s, config.model, config.workers, config.bandwidth, old=True)
        row.update(t_net_s=new['t_net_s'], predicted_s=new['t_step_s'],
                   overlapped_s=new['t_step_min_s'], t_net_old_s=old['t_net_s'],
                   predicted_old_s=old['t_step_s'])
        if measured_s is not None:
            row.update(ratio=measured_s / new['t_step_s'], ratio_old=measured_s / old['t_step_s'])
    return row


def _sort_key(row):
    bw = _cluster.rate_bytes(row['bandwidth']) if row['bandwidth'] else 0.0
    return (MODELS.index(row['model']) if row['model'] in MODELS else len(MODELS), row['model'],
            row['workers'], bw)


def markdown_table(rows):
    """The rows as a Markdown table, sorted by model, workers and bandwidth; seconds per step.

    Columns: model, workers, bandwidth, unshaped step, predicted step,
    measured step, measured / predicted, the step with full overlap
    (``overlapped_s``), the old model's prediction and its ratio, and the CPU
    the machine's other processes used meanwhile (cores). A missing figure is
    a dash; a run without a step time says why.
    """
    def sec(x):
        return '-' if x is None else f'{x:.3f}'

    def ratio(x):
        return '-' if x is None else f'{x:.2f}'
    lines = ['| model | workers | bandwidth | unshaped step (s) | predicted step (s) | '
             'measured step (s) | measured / predicted | full overlap (s) | old model (s) | '
             'measured / old | others (cores) |',
             '| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
    for r in sorted(rows, key=_sort_key):
        measured = sec(r['measured_s'])
        if r['status'] != 'ok':
            measured += f" ({r['status']})"
        others = '-' if r['others_cores'] is None else f"{r['others_cores']:.2f}"
        lines.append(f"| {r['model']} | {r['workers']} | {r['bandwidth']} | "
                     f"{sec(r['unshaped_s'])} | {sec(r['predicted_s'])} | {measured} | "
                     f"{ratio(r['ratio'])} | {sec(r['overlapped_s'])} | "
                     f"{sec(r['predicted_old_s'])} | {ratio(r['ratio_old'])} | {others} |")
    return '\n'.join(lines) + '\n'


def _step_estimate(config, unshaped_s=None, cores=None):
    """The step ``config`` should take: ``unshaped_s`` or a guess, plus the model's network time."""
    cores = cores or os.cpu_count() or 1
    step = unshaped_s
    if step is None:
        step = (COMPUTE_GUESS_S[config.model] * config.batch * config.workers
                / min(cores, config.workers))
    if config.bandwidth:
        step = predict(step, config.model, config.workers, config.bandwidth)['t_step_s']
    return step


def estimate_seconds(config, unshaped_s=None, cores=None):
    """Seconds the run of ``config`` should take: start-up, two epochs, the initial weights.

    ``unshaped_s`` is the measured unshaped step of its model and workers;
    without it a guess from ``COMPUTE_GUESS_S`` and ``cores`` (default: this
    machine's). Shaped runs add ``predict``'s network time per step and the
    initial weights' transfer (every worker pulls them through the server's
    link). Steps as ``steps_for`` chooses them.
    """
    init = 0.0
    if config.bandwidth:
        init = ((config.workers + 1) * gradient_bytes(config.model)
                / (PAYLOAD * _cluster.rate_bytes(config.bandwidth)))
    steps = steps_for(config, unshaped_s, cores)
    return STARTUP_S + init + TIMED_EPOCH * steps * _step_estimate(config, unshaped_s, cores)


# -- what the machine's other processes do meanwhile -----------------------------------------------

_PF_KTHREAD = 0x00200000


class OthersCPU:
    """The CPU time the machine's other processes use while the block runs; a context manager.

    Every ``interval`` seconds a thread reads ``/proc/PID/stat`` of every
    process and adds up the user and system time that processes gained
    which are neither this process nor its descendants nor in one of
    ``namespaces`` (network namespaces by name, e.g. a cluster's). Kernel
    threads are left out: they also carry this study's network traffic.
    After the block, ``seconds`` is the others' CPU seconds, ``wall`` the
    block's seconds and ``cores`` their ratio (0 on an idle machine, up to the
    cores). Processes that start and end between two samples are missed.
    """

    def __init__(self, namespaces=(), interval=0.25):
        self.namespaces, self.interval = list(namespaces), interval
        self.seconds = self.wall = self.cores = 0.0
        self._seen, self._stop, self._thread, self._start = {}, threading.Event(), None, None
        self._tick = os.sysconf('SC_CLK_TCK')

    def __enter__(self):
        self._start = time.monotonic()
        self._sample(first=True)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall = time.monotonic() - self._start
        self.cores = self.seconds / self.wall if self.wall > 0 else 0.0
        return False

    def _loop(self):
        while not self._stop.wait(self.interval):
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


def _stop(proc):
    """End the launcher: SIGTERM twice (its ordered stop, then everything at once), then SIGKILL."""
    for signum in (signal.SIGTERM, signal.SIGTERM):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass
            time.sleep(0.2)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


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
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            out, _ = proc.communicate()
            status = f'timed out after {timeout:.0f} s'
        except BaseException:
            _stop(proc)
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
    deadline = time.monotonic() + 10
    leftover = cl.job_pids()
    while leftover and time.monotonic() < deadline:
        time.sleep(0.2)
        leftover = cl.job_pids()
    return Measurement(config, step, status, watch.wall, watch.cores, load, parse_epochs(text),
                       leftover)


def study(runs, workdir, say=None, log_dir=None, max_others=0.25, retries=2, quiet_wait=120.0):
    """Run the study; yield ``(row, measurements)`` for each shaped run as it is measured.

    ``runs`` is ``plan``'s ``{W: [Config, ...]}``: one cluster of W + 2 hosts
    per worker count, closed before the next. ``say`` takes progress lines
    (configuration, estimate of the time left). A run during which the
    machine's other processes used more than ``max_others`` cores, or that
    failed, is measured again, up to ``retries`` times, after waiting up to
    ``quiet_wait`` seconds for them to quieten; the one with a step time that
    they disturbed least is kept. ``log_dir`` gets each run's launcher output
    (``<name>.log``, every attempt).
    ``row`` is ``table_row``'s (the unshaped run of the same model and
    workers supplies ``unshaped_s``); ``measurements`` are the ``Measurement``
    dicts of the runs it was made of, last the shaped one.
    """
    say = say or (lambda line: None)
    ok, why = _cluster.available()
    if not ok:
        raise StudyError(f'no cluster can be made here: {why}')
    total = sum(len(c) for c in runs.values())
    base_runs, unshaped = {}, {}  # the unshaped runs' Measurements, and their steps
    done = 0
    flat = [c for cs in runs.values() for c in cs]
    for workers, configs in runs.items():
        with _cluster.Cluster(workers + 1 + SERVERS) as cl:
            for config in configs:
                done += 1
                rest = sum(estimate_seconds(c, unshaped.get((c.model, c.workers)))
                           for c in flat[done - 1:])
                config = dataclasses.replace(config, steps=steps_for(
                    config, unshaped.get((config.model, workers))))
                say(f'[{done}/{total}] {config.label}: batch {config.batch} per worker, '
                    f'{TIMED_EPOCH} epochs of {config.steps} steps; about '
                    f'{_minutes(estimate_seconds(config, unshaped.get((config.model, workers))))} '
                    f'for it, {_minutes(rest)} for the rest of the study')
                best = None
                for attempt in range(retries + 1):
                    if attempt:
                        why = ('it failed' if best.status != 'ok' else
                               f'other processes used {best.others_cores:.2f} cores')
                        waited = _wait_quiet(max_others, quiet_wait)
                        say(f'    measuring it again ({attempt} of {retries}): {why}; waited '
                            f'{waited:.0f} s for the other processes to use at most '
                            f'{max_others:g} cores')
                    log = os.path.join(log_dir, f'{config.name}.log') if log_dir else None
                    m = measure(cl, config, workdir, log=log)
                    say(f'    {_said(m)}')
                    if best is None or _better(m, best):
                        best = m
                    if best.status == 'ok' and best.others_cores <= max_others:
                        break
                if config.bandwidth is None:
                    base_runs[(config.model, workers)] = best
                    if best.step_s is not None:
                        unshaped[(config.model, workers)] = best.step_s
                    continue
                base = base_runs.get((config.model, workers))
                base_s = base.step_s if base else None
                status = best.status if best.status != 'ok' else (
                    'ok' if base_s is not None else 'no unshaped step')
                row = table_row(config, base_s, best.step_s,
                                max(best.others_cores, base.others_cores if base else 0.0), status)
                yield row, ([base.to_dict()] if base else []) + [best.to_dict()]


def _better(a, b):
    """Whether measurement ``a`` is kept over ``b``: it has a step time, and was less disturbed."""
    if (a.step_s is None) != (b.step_s is None):
        return a.step_s is not None
    return a.others_cores < b.others_cores


def _said(m):
    step = f'{m.step_s:.3f} s a step' if m.step_s is not None else m.status
    left = f'; LEFT ON THE HOSTS: {m.leftover}' if m.leftover else ''
    return (f'{step} ({m.wall_s:.0f} s in all; other processes used {m.others_cores:.2f} cores, '
            f'load {m.load:.2f}){left}')


def _wait_quiet(max_others, limit):
    """Wait until other processes use at most ``max_others`` cores over 2 s, or ``limit`` s pass."""
    start = time.monotonic()
    while time.monotonic() - start < limit and others_cores(2.0) > max_others:
        pass
    return time.monotonic() - start


def _minutes(seconds):
    return f'{seconds:.0f} s' if seconds < 90 else f'{seconds / 60:.0f} min'

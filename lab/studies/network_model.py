"""The network study's model and plan: the runs, their commands, what the model predicts.

``plan`` lays out the runs (``Config``: a model, W workers, every link at a
bandwidth or unshaped); ``train_argv`` and ``launch_argv`` are their
commands; ``predict`` is ``scaling.worker_projection``'s step for a model
on W workers, one server, at a tc rate's TCP payload (``PAYLOAD``);
``steps_for`` and ``estimate_seconds`` size and time a run before it runs.
``network`` says how the study measures and why.
"""
import math
import os
import shutil
from dataclasses import dataclass
from typing import Optional

from lab.hosts import cluster as _cluster
from lab.studies.jobs import StudyError
from lab.studies.scaling_model import worker_projection

__all__ = ['MODELS', 'GRAD_BYTES', 'LARGEST_KEY_BYTES', 'PAYLOAD', 'DEFAULT_BATCH',
           'DEFAULT_STEPS', 'TIMED_SECONDS', 'QUICK_STEPS', 'BANDWIDTHS', 'SERVERS',
           'TIMED_EPOCH', 'WORKER_THREADS', 'Config', 'gradient_bytes', 'plan', 'steps_for',
           'train_argv', 'launch_argv', 'predict', 'estimate_seconds']

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


# -- the commands --------------------------------------------------------------------------------

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


# -- the prediction and the estimates ------------------------------------------------------------

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

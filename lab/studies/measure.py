"""Measurements on devices: one gradient synchronisation, one step's compute, a sweep of runs.

What ``scripts/bandwidth.py`` and ``scripts/scaling.py`` measure; the
arithmetic on the results is in ``scaling``. Every timer starts after
``npx.waitall()`` (nothing queued) and stops after another, so a time is what
the devices took, not how long Python took to queue the work; figures are
medians over repeats after one untimed warm-up (which compiles the graph,
creates the kvstore and fills the gradients).

A measurement takes minutes; a stop request (``StopRequest``) is asked
between its steps (``check_stop``), and a program that stops where the code
is (``base.signals.raising``) unwinds through every ``with`` and ``finally``
on the way (temporary files, threads, child processes): both raise
``errors.Interrupted``.
"""
import statistics
import time

import numpy as onp
from gluon_multigpu import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import autograd, gluon, np, npx

from lab.studies import scaling_model as scaling
from gluon_multigpu.section.data import ArrayLoader, train_loader
from gluon_multigpu.section.devices import split_batch
from lab.studies.counts import device_counts, devices_for
from gluon_multigpu.base.background import Background
from gluon_multigpu.errors import TrainingDiverged
from gluon_multigpu.section.model import default_initializer, get_model, memory_needed
from gluon_multigpu.section.kvstores import ReducingTrainer, has_nccl, kvstore_name, make_trainer
from gluon_multigpu.observe.progress import Progress
from lab.studies.sweep import check_stop
from gluon_multigpu.machinery.training import Hook, hybridize, train

__all__ = ['usable_kvstores', 'build_net', 'trainable_params', 'gradient_bytes', 'real_batch',
           'time_compute', 'sync_trainer', 'time_sync', 'measure_bandwidth', 'measure_count',
           'compute_seconds', 'config_label',
           'measure_projection', 'run_sweep', 'train_config', 'OtherWork', 'check_stop', 'WorkDone',
           'bandwidth_memory', 'MODEL_COST']

#: Relative cost of a sample's forward and backward pass, for estimates of a run's time: ResNet-18
#: trains about 60 times slower than the simple CNN on CPU contexts (README, docs/results.md).
MODEL_COST = {'resnet18': 60.0, 'simple-cnn': 1.0}


def bandwidth_memory(model, num_devices, batch_per_device):
    """Estimated peak bytes of ``measure_count`` on CPU contexts (the training estimate)."""
    return memory_needed(model, batch_per_device * num_devices, num_devices)


def usable_kvstores(device_type):
    """The kvstores this machine can use: local, device, none; nccl with GPUs and NCCL."""
    return ['local', 'device', 'none'] + (['nccl'] if device_type == 'gpu' and has_nccl() else [])


def build_net(model, devices, seed=0):
    """Return ``model`` initialised on ``devices`` (seeded, its usual initializer), hybridized."""
    mx.random.seed(seed)
    net = get_model(model, 10)
    net.initialize(default_initializer(model), ctx=devices)
    hybridize(net)
    return net


def trainable_params(net):
    """The parameters that get a gradient (BatchNorm's running statistics do not)."""
    return [p for p in net.collect_params().values() if p.grad_req != 'null']


def gradient_bytes(net):
    """Return ``(parameters, bytes)`` of the gradients a synchronisation sums (after a forward)."""
    grads = [p.list_grad()[0] for p in trainable_params(net)]
    return sum(g.size for g in grads), sum(g.size * g.dtype.itemsize for g in grads)


def real_batch(images, labels, batch):
    """Return ``(X, y)``: the first ``batch`` real images (repeated if fewer), scaled to [0, 1]."""
    idx = onp.arange(batch) % len(labels)
    return next(iter(ArrayLoader(images[idx], labels[idx], batch)))


def time_compute(net, X, y, devices, repeats, trainer=None, stop=None):
    """Time forward + backward of ``X, y`` split over ``devices``; return each repeat's seconds.

    The shards are put on the devices first (not timed); an untimed warm-up
    step compiles the graph. With ``trainer``, each timed step also calls
    ``trainer.step`` (on one device: the SGD update alone). Without it, every
    device's gradients afterwards hold its shard's real gradient. ``stop``
    (a ``StopRequest``) is asked between steps (``check_stop``).
    """
    X_shards, y_shards = split_batch(X, y, devices)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            losses = [loss(net(a), b) for a, b in zip(X_shards, y_shards)]
        for l in losses:
            l.backward()
        if trainer is not None:
            trainer.step(X.shape[0])
    check_stop(stop)
    step()
    npx.waitall()
    times = []
    for _ in range(repeats):
        check_stop(stop)
        tic = time.perf_counter()
        step()
        npx.waitall()  # sync point: every device has finished its backward pass
        times.append(time.perf_counter() - tic)
    return times


def sync_trainer(net, kvstore):
    """Return a Trainer whose ``allreduce_grads()`` is one synchronisation through ``kvstore``.

    MXNet's kvstores (``local``, ``device``, ``nccl``) with
    ``update_on_kvstore=False``, so that the call only sums the gradients and
    copies the sum back to every device; ``none`` is the package's
    ``ReducingTrainer``, which does the same in plain array operations.
    """
    params = net.collect_params()
    if kvstore_name(kvstore) == 'none':
        return ReducingTrainer(params, 'sgd', {'learning_rate': 0.1})
    return gluon.Trainer(params, 'sgd', {'learning_rate': 0.1}, kvstore=kvstore,
                         update_on_kvstore=False)


def time_sync(net, kvstore, num_devices, repeats, stop=None):
    """Time ``trainer.allreduce_grads()`` through ``kvstore``; return the seconds of each repeat.

    The gradients must be filled (``time_compute``). After each timed call
    every copy holds the sum; it is divided by the device count (not timed),
    so the values stay the size of real gradients however many repeats run.
    """
    trainer = sync_trainer(net, kvstore)
    grads = [g for p in trainable_params(net) for g in p.list_grad()]

    def back_to_mean():
        for g in grads:
            g[:] /= num_devices
        npx.waitall()
    trainer.allreduce_grads()  # warm-up: creates the kvstore and its buffers
    back_to_mean()
    times = []
    for _ in range(repeats):
        check_stop(stop)
        tic = time.perf_counter()
        trainer.allreduce_grads()
        npx.waitall()  # sync point: the sum is on every device
        times.append(time.perf_counter() - tic)
        back_to_mean()
    return times


def measure_bandwidth(model, device_type, counts, kvstores, batch_per_device, images, labels,
                      repeats, compute_repeats=None, seed=0, progress=None, stop=None):
    """Measure one synchronisation per (count, kvstore), and the compute of one step per count.

    (More: lab/NOTES.md.)
    """
    rows = []
    for n in counts:
        rows += measure_count(model, device_type, n, kvstores, batch_per_device, images, labels,
                              repeats, compute_repeats, seed, progress, stop)
    return rows


def measure_count(model, device_type, n, kvstores, batch_per_device, images, labels, repeats,
                  compute_repeats=None, seed=0, progress=None, stop=None):
    """``measure_bandwidth`` at one device count ``n``: one row per kvstore."""
    compute_repeats = repeats if compute_repeats is None else compute_repeats
    devices = devices_for(device_type, n)
    net = build_net(model, devices, seed)
    X, y = real_batch(images, labels, batch_per_device * n)
    compute = time_compute(net, X, y, devices, compute_repeats, stop=stop)
    params, nbytes = gradient_bytes(net)
    if progress and compute:
        progress(f'  {model} on {n} {device_type} devices: forward + backward of '
                 f'{batch_per_device} per device {statistics.median(compute) * 1e3:.1f} ms')
    rows = []
    for kvstore in kvstores:
        sync = time_sync(net, kvstore, n, repeats, stop=stop)
        rows.append(scaling.bandwidth_row(model, device_type, n, kvstore, params, nbytes,
                                          sync, compute, batch_per_device))
        if progress:
            progress(f'  {model} on {n} {device_type} devices, kvstore {kvstore}: one '
                     f'synchronisation {rows[-1]["sync_s"] * 1e3:.2f} ms, '
                     f'{rows[-1]["alg_gbps"]:.2f} GB/s')
    del net
    return rows


def compute_seconds(model, device_type, batches, images, labels, repeats, seed=0, stop=None):
    """Return ``{b: seconds}``: the median training step of ``b`` samples on one device.

    A step is forward, backward and the SGD update (one device: no
    synchronisation); loading the batch is not timed.
    """
    devices = devices_for(device_type, 1)
    net = build_net(model, devices, seed)
    trainer = make_trainer(net, 1e-3, 'device')  # one device: MXNet creates no kvstore
    return {b: statistics.median(time_compute(net, *real_batch(images, labels, b), devices,
                                              repeats, trainer, stop))
            for b in sorted(set(batches))}


def measure_projection(model, device_type, counts, kvstores, batch_mode, batches, images,
                       labels, project_to=16, compute_repeats=5, sync_repeats=5, seed=0,
                       progress=None, stop=None):
    """Measure the inputs of the projection model and project; return ``(projection, sync rows)``.

    One synchronisation per kvstore at every count >= 2 of ``counts`` (the
    gradients filled by a forward and backward pass of 4 real images per
    device), the slope ``s`` fitted per kvstore (``scaling.fit_sync_slope``),
    and one device's training step (``compute_seconds``) at every per-device
    batch the projection to 1, 2, 4, ... ``project_to`` devices needs. Both lists are
    empty when no count is 2 or more.
    """
    measured = [n for n in counts if n >= 2]
    if not measured:
        if progress:
            progress('no count of 2 or more: no synchronisation to fit, no projection')
        return [], []
    if progress:
        progress(f'projection inputs: synchronisation on {", ".join(map(str, measured))} '
                 'devices, compute on one device')
    sync_rows = measure_bandwidth(model, device_type, measured, kvstores, 4, images, labels,
                                  sync_repeats, compute_repeats=0, seed=seed, progress=progress,
                                  stop=stop)
    targets = device_counts(project_to)
    compute = compute_seconds(model, device_type,
                              scaling.projection_batches(batch_mode, batches, targets),
                              images, labels, compute_repeats, seed, stop)
    projection = []
    for kvstore in kvstores:
        slope = scaling.fit_sync_slope([(r['devices'], r['sync_s']) for r in sync_rows
                                        if r['kvstore'] == kvstore])
        for batch in batches:
            projection += scaling.projection_rows(model, device_type, kvstore, batch_mode, batch,
                                                  compute, slope, targets)
    return projection, sync_rows


def run_sweep(grid, device_type, train_data, test_data, seed=0, progress=None,
              progress_interval=10.0, hooks=()):
    """Train once per configuration with ``training.train``; return ``scaling.measured_row`` dicts.

    Every run starts from the same seed (initial weights) and the same data
    order. A run whose loss becomes NaN or infinite is recorded with status
    ``diverged`` and the sweep goes on: that is a result about its learning rate.

    (More: lab/NOTES.md.)
    """
    say = progress or (lambda line: None)
    rows = []
    for i, config in enumerate(grid, 1):
        say(f'[{i}/{len(grid)}] {config_label(config)}: training {config.epochs} epoch(s)')
        rows.append(train_config(config, device_type, train_data, test_data, seed, progress,
                                 progress_interval, hooks))
    return rows


def config_label(config):
    """What a run of the sweep is, in words: its devices, kvstore, batch and learning rate."""
    return (f'{config.model}, {config.devices} device(s), kvstore {config.kvstore}, batch '
            f'{config.batch_size} ({config.per_device_batch:g} per device), lr rule '
            f'{config.lr_rule} (lr {config.lr:g})')


def train_config(config, device_type, train_data, test_data, seed=0, progress=None,
                 progress_interval=10.0, hooks=()):
    """Train one configuration of a sweep; return its ``scaling.measured_row``.

    ``progress`` gets its epochs and, every ``progress_interval`` seconds, its
    progress within an epoch, each line naming the run. A ``StopRequest`` in
    ``hooks`` stops it after a step (``Interrupted``).
    """
    say = progress or (lambda line: None)
    devices = devices_for(device_type, config.devices)
    train_iter = train_loader(*train_data, config.batch_size, config.devices, seed)
    test_iter = ArrayLoader(*test_data, config.batch_size)
    label = config_label(config)
    shown = [Progress(say, progress_interval, label, config.epochs)] \
        if progress and progress_interval > 0 else []
    try:
        result = train(
            get_model(config.model, 10), train_iter, test_iter, devices,
            num_epochs=config.epochs, lr=config.lr, kvstore=config.kvstore, seed=seed,
            initializer=default_initializer(config.model), progress_interval=0,  # lines: above
            on_epoch=lambda r: say(f'  {label}: epoch {r.epoch}/{config.epochs}: loss '
                                   f'{r.train_loss:.4f}, test acc {r.test_acc:.3f}, '
                                   f'{r.samples_per_sec:.0f} samples/s'),
            hooks=[*hooks, *shown])
        return scaling.measured_row(config, device_type, result.epochs)
    except TrainingDiverged as e:
        say(f'{label}: {e}')
        return scaling.measured_row(config, device_type, None, status='diverged')


class WorkDone(Hook):
    """A ``train`` hook that reports after each step the samples trained so far in the run.

    ``report(samples)`` (a sweep's ``advance``); ``per_epoch``: samples of an epoch.
    """

    def __init__(self, report, per_epoch):
        self.report, self.per_epoch = report, per_epoch

    def step_end(self, run, step, samples, timer):
        self.report((run.epoch - 1) * self.per_epoch + samples)


class OtherWork(Background):
    """Other work on a device, as a device shared with another job sees it: a context manager.

    A thread queues a ``size`` x ``size`` matrix product on ``device``, waits
    for it and queues the next, until the ``with`` block ends. MXNet runs
    each CPU context's operators on that context's own worker thread, so the
    training operators of that context queue behind these: the context is
    slower than the others. ``move_to`` moves the work to another device
    (a load that drifts); ``device`` None is no work at all.
    """

    #: Seconds between two products, with nothing of this work queued (see ``work``).
    PAUSE = 0.002
    thread_name = 'other-work'

    def __init__(self, device, size=512):
        self.device, self.size = device, size

    def move_to(self, device):
        """From now on, load ``device`` (None: stop loading)."""
        self.device = device

    def work(self):
        matrices = {}
        while not self.finished.is_set():
            device = self.device
            if device is None:
                self.finished.wait(0.01)
                continue
            if device not in matrices:
                matrices[device] = np.ones((self.size, self.size), ctx=device)
            np.dot(matrices[device], matrices[device]).wait_to_read()
            # A pause with nothing queued: ``npx.waitall()`` in the training thread returns
            # only when it sees the engine empty, and a product queued at once after the last
            # kept it waiting (a minute and more on a loaded machine, however a signal asked).
            self.finished.wait(self.PAUSE)

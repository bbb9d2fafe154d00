"""Measurements on devices: one gradient synchronisation, one step's compute, a sweep of runs.

What ``scripts/bandwidth.py`` and ``scripts/scaling.py`` measure; the
arithmetic on the results is in ``scaling``. Every timer starts after
``npx.waitall()`` (nothing queued) and stops after another, so a time is what
the devices took, not how long Python took to queue the work; figures are
medians over repeats after one untimed warm-up (which compiles the graph,
creates the kvstore and fills the gradients).
"""
import os
import statistics
import time

import numpy as onp
from . import _mxnet  # noqa: F401  (engine settings, then MXNet in NumPy mode)
import mxnet as mx
from mxnet import autograd, gluon, npx

from . import scaling
from .data import ArrayLoader
from .devices import gpu_devices, num_gpus, split_batch
from .errors import DeviceError, TrainingDiverged
from .model import default_initializer, get_model
from .training import ReducingTrainer, has_nccl, hybridize, kvstore_name, make_trainer, train

__all__ = ['resolve_devices', 'devices_for', 'usable_kvstores', 'engine_description',
           'build_net', 'trainable_params', 'gradient_bytes', 'real_batch', 'time_compute',
           'sync_trainer', 'time_sync', 'measure_bandwidth', 'compute_seconds',
           'measure_projection', 'make_train_loader', 'run_sweep']


def resolve_devices(num_gpus_wanted=None, cpu_devices_wanted=None, counts=None, minimum=1,
                    cpu_default=(1,)):
    """Decide the device type and the device counts of a sweep.

    Parameters
    ----------
    num_gpus_wanted, cpu_devices_wanted : int, optional
        ``--num-gpus N`` / ``--cpu-devices N``: GPUs or CPU contexts, counts up to N.
    counts : list of int, optional
        Explicit counts (``--counts``); otherwise 1 (or ``minimum``), 2, 4, ... up to the maximum.
    minimum : int
        Smallest count that makes sense (2 for a synchronisation).
    cpu_default : list of int
        Counts without GPUs and without flags.

    Returns
    -------
    (str, list of int, str or None)
        ``'gpu'`` or ``'cpu'``, the sorted counts, and a note saying what was
        chosen when no flag decided it.
    """
    counts = sorted(set(counts)) if counts else None
    if counts and counts[0] < minimum:
        raise DeviceError(f'a gradient synchronisation needs at least {minimum} devices, got a '
                          f'count of {counts[0]}; give counts of {minimum} or more')
    for flag, wanted in (('--cpu-devices', cpu_devices_wanted), ('--num-gpus', num_gpus_wanted)):
        if wanted is None:
            continue
        if flag == '--num-gpus':
            gpu_devices(wanted)  # raises, naming how many exist, if fewer do
        if counts and counts[-1] > wanted:
            raise DeviceError(f'--counts {counts[-1]} exceeds {flag} {wanted}; raise {flag} or '
                              'leave the count out')
        chosen = counts or scaling.device_counts(wanted, minimum)
        if not chosen:
            raise DeviceError(f'{flag} {wanted} gives no device count of at least {minimum}; '
                              f'use {flag} {minimum} or more')
        return ('cpu' if flag == '--cpu-devices' else 'gpu'), chosen, None
    available = num_gpus()
    if available:
        if counts:
            gpu_devices(counts[-1])
            return 'gpu', counts, None
        chosen = scaling.device_counts(available, minimum)
        if not chosen:
            raise DeviceError(f'only {available} GPU is available and this needs at least '
                              f'{minimum} devices; use --cpu-devices {2 * minimum} to measure '
                              'CPU contexts instead')
        return 'gpu', chosen, None
    chosen = counts or sorted(cpu_default)
    return 'cpu', chosen, (f'no GPU found: using CPU contexts, counts {", ".join(map(str, chosen))}'
                           '; --cpu-devices N sets the largest count')


def devices_for(device_type, n):
    """Return the first ``n`` devices of ``device_type`` (``'gpu'`` or ``'cpu'``)."""
    if device_type == 'gpu':
        return gpu_devices(n)
    return [mx.cpu(i) for i in range(n)]


def usable_kvstores(device_type):
    """The kvstores this machine can use: local, device, none; nccl with GPUs and NCCL."""
    return ['local', 'device', 'none'] + (['nccl'] if device_type == 'gpu' and has_nccl() else [])


def engine_description(device_type, environ=None):
    """Say which engine settings the measurements ran under (for reports)."""
    environ = os.environ if environ is None else environ
    if device_type == 'gpu':
        return f"GPUs, MXNET_ENABLE_GPU_P2P={environ.get('MXNET_ENABLE_GPU_P2P', '1 (default)')}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
    threads = environ.get('OMP_NUM_THREADS', "MXNet's default (half the cores)")
    return (f'CPU contexts on {cores} core(s), OMP_NUM_THREADS={threads} per context in every '
            f"run, MXNET_CPU_TEMP_COPY={environ.get('MXNET_CPU_TEMP_COPY', '4 (default)')}; each "
            'context stands for one device of a fixed size, so fewer contexts leave cores idle '
            'and more contexts than cores share them')


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


def time_compute(net, X, y, devices, repeats, trainer=None):
    """Time forward + backward of ``X, y`` split over ``devices``; return each repeat's seconds.

    The shards are put on the devices first (not timed); an untimed warm-up
    step compiles the graph. With ``trainer``, each timed step also calls
    ``trainer.step`` (on one device: the SGD update alone). Without it, every
    device's gradients afterwards hold its shard's real gradient.
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
    step()
    npx.waitall()
    times = []
    for _ in range(repeats):
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


def time_sync(net, kvstore, num_devices, repeats):
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
        tic = time.perf_counter()
        trainer.allreduce_grads()
        npx.waitall()  # sync point: the sum is on every device
        times.append(time.perf_counter() - tic)
        back_to_mean()
    return times


def measure_bandwidth(model, device_type, counts, kvstores, batch_per_device, images, labels,
                      repeats, compute_repeats=None, seed=0, progress=None):
    """Measure one synchronisation per (count, kvstore), and the compute of one step per count.

    Parameters
    ----------
    model : str
        ``resnet18`` or ``simple-cnn``.
    counts : list of int
        Device counts, each at least 2.
    kvstores : list of str
    batch_per_device : int
        Samples per device of the forward and backward pass that fills the
        gradients and is timed as the compute of a step.
    images, labels : numpy.ndarray
        Real images (uint8) and labels for that pass.
    repeats : int
        Timed synchronisations per configuration.
    compute_repeats : int, optional
        Timed compute steps (default ``repeats``; 0 fills the gradients only).
    progress : callable, optional
        Called with a line of text after each measurement.

    Returns
    -------
    list of dict
        ``scaling.bandwidth_row`` per (count, kvstore).
    """
    compute_repeats = repeats if compute_repeats is None else compute_repeats
    rows = []
    for n in counts:
        devices = devices_for(device_type, n)
        net = build_net(model, devices, seed)
        X, y = real_batch(images, labels, batch_per_device * n)
        compute = time_compute(net, X, y, devices, compute_repeats)
        params, nbytes = gradient_bytes(net)
        if progress and compute:
            progress(f'{model} on {n} {device_type} devices: forward + backward of '
                     f'{batch_per_device} per device {statistics.median(compute) * 1e3:.1f} ms')
        for kvstore in kvstores:
            sync = time_sync(net, kvstore, n, repeats)
            rows.append(scaling.bandwidth_row(model, device_type, n, kvstore, params, nbytes,
                                              sync, compute, batch_per_device))
            if progress:
                progress(f'{model} on {n} {device_type} devices, kvstore {kvstore}: one '
                         f'synchronisation {rows[-1]["sync_s"] * 1e3:.2f} ms, '
                         f'{rows[-1]["alg_gbps"]:.2f} GB/s')
        del net
    return rows


def compute_seconds(model, device_type, batches, images, labels, repeats, seed=0):
    """Return ``{b: seconds}``: the median training step of ``b`` samples on one device.

    A step is forward, backward and the SGD update (one device: no
    synchronisation); loading the batch is not timed.
    """
    devices = devices_for(device_type, 1)
    net = build_net(model, devices, seed)
    trainer = make_trainer(net, 1e-3, 'device')  # one device: MXNet creates no kvstore
    return {b: statistics.median(time_compute(net, *real_batch(images, labels, b), devices,
                                              repeats, trainer))
            for b in sorted(set(batches))}


def measure_projection(model, device_type, counts, kvstores, batch_mode, batches, images,
                       labels, project_to=16, compute_repeats=5, sync_repeats=5, seed=0,
                       progress=None):
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
                                  sync_repeats, compute_repeats=0, seed=seed, progress=progress)
    targets = scaling.device_counts(project_to)
    compute = compute_seconds(model, device_type,
                              scaling.projection_batches(batch_mode, batches, targets),
                              images, labels, compute_repeats, seed)
    projection = []
    for kvstore in kvstores:
        slope = scaling.fit_sync_slope([(r['devices'], r['sync_s']) for r in sync_rows
                                        if r['kvstore'] == kvstore])
        for batch in batches:
            projection += scaling.projection_rows(model, device_type, kvstore, batch_mode, batch,
                                                  compute, slope, targets)
    return projection, sync_rows


def make_train_loader(images, labels, batch_size, num_devices, seed):
    """The training loader of one run; a last batch too small to split across devices is dropped."""
    remainder = len(labels) % batch_size
    last_batch = 'discard' if 0 < remainder < num_devices else 'keep'
    return ArrayLoader(images, labels, batch_size, shuffle=True, seed=seed, last_batch=last_batch)


def run_sweep(grid, device_type, train_data, test_data, seed=0, progress=None,
              progress_interval=10.0):
    """Train once per configuration with ``training.train``; return ``scaling.measured_row`` dicts.

    Every run starts from the same seed (initial weights) and the same data
    order. A run whose loss becomes NaN or infinite is recorded with status
    ``diverged`` and the sweep goes on: that is a result about its learning rate.

    Parameters
    ----------
    grid : list of scaling.Config
    train_data, test_data : (numpy.ndarray, numpy.ndarray)
        uint8 images and int32 labels.
    progress : callable, optional
        Called with lines of text: each run's start, its epochs, its progress within an epoch.
    """
    rows = []
    say = progress or (lambda line: None)
    for i, config in enumerate(grid, 1):
        devices = devices_for(device_type, config.devices)
        train_iter = make_train_loader(*train_data, config.batch_size, config.devices, seed)
        test_iter = ArrayLoader(*test_data, config.batch_size)
        label = (f'[{i}/{len(grid)}] {config.devices} device(s), kvstore {config.kvstore}, batch '
                 f'{config.batch_size} ({config.per_device_batch:g} per device), lr rule '
                 f'{config.lr_rule} (lr {config.lr:g})')
        say(f'{label}: training {config.epochs} epoch(s)')
        try:
            result = train(
                get_model(config.model, 10), train_iter, test_iter, devices,
                num_epochs=config.epochs, lr=config.lr, kvstore=config.kvstore, seed=seed,
                initializer=default_initializer(config.model),
                on_epoch=lambda r: say(f'  epoch {r.epoch}: loss {r.train_loss:.4f}, test acc '
                                       f'{r.test_acc:.3f}, {r.samples_per_sec:.0f} samples/s'),
                on_progress=(lambda e, b, s, t: say(f'  epoch {e}: {b} batches, {t:.0f} s'))
                if progress and progress_interval > 0 else None,
                progress_interval=progress_interval)
            rows.append(scaling.measured_row(config, device_type, result.epochs))
        except TrainingDiverged as e:
            say(f'{label}: {e}')
            rows.append(scaling.measured_row(config, device_type, None, status='diverged'))
    return rows

"""How training speed and accuracy change with the number of devices (d2l 13.6, exercise 1).

The arithmetic, the projection model and the output files of
``scripts/bandwidth.py`` and ``scripts/scaling.py``; the measurements that
feed them are in ``measure``. This module does not import MXNet.

Definitions used throughout:

In lab/NOTES.md, under this module's name.
"""
import math
import statistics
from dataclasses import dataclass

from gluon_multigpu.errors import GluonMultiGPUError

__all__ = ['LR_RULES', 'REFERENCE_BATCH', 'BATCH_MODES', 'learning_rate', 'bus_factor',
           'bandwidth', 'bandwidth_row', 'BANDWIDTH_COLUMNS', 'SYNC_COLUMNS', 'Config',
           'build_grid', 'measured_row', 'steps_row', 'MEASURED_COLUMNS',
           'WARMUP_STEPS', 'add_speedups', 'fit_sync_slope',
           'per_device_batch_at', 'projection_batches', 'projection_rows', 'worker_projection',
           'PROJECTION_COLUMNS']

#: Learning-rate rules of a sweep (see ``learning_rate``).
LR_RULES = ('linear', 'fixed', 'sqrt')
#: The batch the base learning rate belongs to (the book's one-GPU batch).
REFERENCE_BATCH = 256
#: ``per-device``: the global batch grows with the devices (the book's way);
#: ``global``: the global batch stays fixed and each device gets a share.
BATCH_MODES = ('per-device', 'global')


def learning_rate(rule, base_lr, batch_size, reference=REFERENCE_BATCH):
    """Return the learning rate of ``rule`` (one of ``LR_RULES``) for a global batch B.

    ``linear``: base x B / 256 (the book: 0.1 at 256, 0.2 at 512); ``fixed``:
    base; ``sqrt``: base x sqrt(B / 256).
    """
    if rule == 'linear':
        return base_lr * batch_size / reference
    if rule == 'fixed':
        return base_lr
    if rule == 'sqrt':
        return base_lr * math.sqrt(batch_size / reference)
    raise GluonMultiGPUError(f'unknown learning-rate rule {rule!r}; choose one of '
                             f'{", ".join(LR_RULES)}')


def bus_factor(num_devices):
    """``2 (N - 1) / N``: the all-reduce convention's factor from algorithm to bus bandwidth."""
    return 2 * (num_devices - 1) / num_devices


def bandwidth(grad_bytes, seconds, num_devices):
    """Return ``(algorithm GB/s, bus GB/s)`` of summing ``grad_bytes`` in ``seconds``, N devices."""
    alg = grad_bytes / seconds / 1e9
    return alg, alg * bus_factor(num_devices)


#: Columns of ``bandwidth.py``'s CSV, in order.
BANDWIDTH_COLUMNS = ['model', 'device_type', 'devices', 'kvstore', 'params', 'grad_bytes',
                     'sync_s', 'alg_gbps', 'bus_gbps', 'batch_per_device', 'compute_s',
                     'sync_per_compute', 'repeats']
#: Columns of ``scaling.py``'s ``sync.csv`` (the synchronisations the projection is fitted to).
SYNC_COLUMNS = ['model', 'device_type', 'devices', 'kvstore', 'params', 'grad_bytes', 'sync_s',
                'alg_gbps', 'bus_gbps', 'repeats']


def bandwidth_row(model, device_type, num_devices, kvstore, params, grad_bytes, sync_times,
                  compute_times=None, batch_per_device=None):
    """Return one configuration's figures as a dict (``BANDWIDTH_COLUMNS`` and the raw times).

    (More: lab/NOTES.md.)
    """
    sync_s = statistics.median(sync_times)
    alg, bus = bandwidth(grad_bytes, sync_s, num_devices)
    compute_s = statistics.median(compute_times) if compute_times else None
    return {'model': model, 'device_type': device_type, 'devices': num_devices,
            'kvstore': kvstore, 'params': params, 'grad_bytes': grad_bytes, 'sync_s': sync_s,
            'alg_gbps': alg, 'bus_gbps': bus, 'batch_per_device': batch_per_device,
            'compute_s': compute_s,
            'sync_per_compute': sync_s / compute_s if compute_s else None,
            'repeats': len(sync_times), 'sync_s_runs': list(sync_times),
            'compute_s_runs': list(compute_times or [])}


# --- the sweep ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One training run of the sweep."""
    model: str
    devices: int
    kvstore: str
    batch_mode: str
    batch_size: int
    lr_rule: str
    lr: float
    epochs: int

    @property
    def per_device_batch(self):
        """Samples per device per step (the mean over devices when the batch does not divide)."""
        if self.batch_size % self.devices == 0:
            return self.batch_size // self.devices
        return self.batch_size / self.devices

    @property
    def batch_key(self):
        """What stays fixed along a series: the per-device batch, or the global batch."""
        return self.per_device_batch if self.batch_mode == 'per-device' else self.batch_size

    @property
    def series(self):
        """The runs that share everything but the device count (``add_speedups`` compares them)."""
        return (self.model, self.kvstore, self.batch_mode, self.batch_key, self.lr_rule)


def build_grid(model, counts, kvstores, lr_rules, base_lr, epochs, batches,
               batch_mode='per-device'):
    """Return every configuration of the sweep, one series after the other.

    (More: lab/NOTES.md.)
    """
    if batch_mode not in BATCH_MODES:
        raise GluonMultiGPUError(f'unknown batch mode {batch_mode!r}')
    grid = []
    for kvstore in kvstores:
        for batch in batches:
            for rule in lr_rules:
                for n in counts:
                    global_batch = _global_batch(batch_mode, batch, n)
                    if global_batch < n:
                        raise GluonMultiGPUError(
                            f'a global batch of {global_batch} cannot be split across {n} '
                            f'devices; use `global_batch` {n} or more, or fewer devices')
                    grid.append(Config(model, n, kvstore, batch_mode, global_batch, rule,
                                       learning_rate(rule, base_lr, global_batch), epochs))
    return grid


#: Untimed training steps of a speed measurement before its timed ones: the first builds the
#: graph and the kvstore.
WARMUP_STEPS = 2

#: Columns of ``scaling.csv``, in order (``kind``: ``measured``, a full run; ``steps``, a
#: speed measurement).
MEASURED_COLUMNS = ['kind', 'model', 'device_type', 'devices', 'kvstore', 'batch_mode',
                    'batch_size', 'per_device_batch', 'lr_rule', 'lr', 'epochs',
                    'timed_epochs', 'sec_per_epoch', 'samples_per_sec', 'speedup', 'efficiency',
                    'train_loss', 'test_acc', 'status', 'timed_steps', 'sec_per_step']


def measured_row(config, device_type, epochs=None, status='ok'):
    """Return the CSV row of one training run.

    Parameters
    ----------
    config : Config
    epochs : list of EpochRecord, optional
        The run's epochs (``None`` if it did not finish). Seconds and samples/s
        are over all epochs but the first when there are two or more: the
        first also builds the compiled graph and chooses convolution algorithms.
    status : str
        ``ok``, or why the run has no figures (e.g. ``diverged``).
    """
    row = {'kind': 'measured', 'model': config.model, 'device_type': device_type,
           'devices': config.devices, 'kvstore': config.kvstore,
           'batch_mode': config.batch_mode, 'batch_size': config.batch_size,
           'per_device_batch': config.per_device_batch, 'lr_rule': config.lr_rule,
           'lr': config.lr, 'epochs': config.epochs, 'timed_epochs': None,
           'sec_per_epoch': None, 'samples_per_sec': None, 'speedup': None,
           'efficiency': None, 'train_loss': None, 'test_acc': None, 'status': status,
           'timed_steps': None, 'sec_per_step': None}
    if epochs:
        timed = epochs[1:] if len(epochs) > 1 else epochs
        seconds = sum(e.seconds for e in timed)
        row.update(timed_epochs=len(timed), sec_per_epoch=seconds / len(timed),
                   samples_per_sec=sum(e.samples for e in timed) / seconds,
                   train_loss=epochs[-1].train_loss, test_acc=epochs[-1].test_acc)
    return row


def steps_row(config, device_type, totals=None, status='ok'):
    """Return the CSV row of one speed measurement: ``config``'s training steps on a bounded
    number of batches (``kind`` ``steps``; no epochs, no test accuracy).

    ``totals``: the ``EpochTotals`` of the timed steps (``None`` if they did not finish);
    samples/s is their samples over their seconds, up to ``npx.waitall()``.
    """
    row = dict(measured_row(config, device_type, None, status), kind='steps', epochs=None)
    if totals is not None and totals.batches:
        row.update(timed_steps=totals.batches, sec_per_step=totals.seconds / totals.batches,
                   samples_per_sec=totals.samples / totals.seconds,
                   train_loss=totals.loss_sum / totals.samples)
    return row


def _series_key(row):
    key = row['per_device_batch'] if row['batch_mode'] == 'per-device' else row['batch_size']
    return (row['model'], row['kvstore'], row['batch_mode'], float(key), row['lr_rule'])


def add_speedups(rows):
    """Fill ``speedup`` and ``efficiency`` of measured rows in place; return ``rows``.

    The baseline of a row is the 1-device row of its series (see the module
    docstring); without one (or when a run failed) both stay ``None``.
    """
    base = {_series_key(r): r['samples_per_sec'] for r in rows
            if r['devices'] == 1 and r['samples_per_sec']}
    for r in rows:
        reference = base.get(_series_key(r))
        if reference and r['samples_per_sec']:
            r['speedup'] = r['samples_per_sec'] / reference
            r['efficiency'] = r['speedup'] / r['devices']
    return rows


# --- the projection model -------------------------------------------------------------------

def fit_sync_slope(points):
    """Fit ``t_sync(N) = s (N - 1)`` by least squares to measured ``(N, seconds)`` pairs; return s.

    A line through the origin in ``N - 1``: one device needs no
    synchronisation, and every further device adds one more gradient set to
    sum and copy back (exact for kvstore ``local``, which sums on the CPU; an
    upper-bound-like simplification for back ends whose cost grows slower).
    ``s = sum((N - 1) t) / sum((N - 1)^2)`` over the points with N >= 2.
    """
    pts = [(n, t) for n, t in points if n >= 2]
    if not pts:
        raise GluonMultiGPUError('fitting the synchronisation cost needs a measurement on at '
                                 'least 2 devices')
    return sum((n - 1) * t for n, t in pts) / sum((n - 1) ** 2 for n, _ in pts)


def per_device_batch_at(batch_mode, batch, num_devices):
    """Samples on the busiest device at N devices: ``batch`` per device, or ceil(global / N)."""
    return batch if batch_mode == 'per-device' else -(-batch // num_devices)


def _global_batch(batch_mode, batch, num_devices):
    return batch * num_devices if batch_mode == 'per-device' else batch


def projection_batches(batch_mode, batches, counts):
    """The per-device batches whose compute time ``projection_rows`` needs, sorted."""
    return sorted({per_device_batch_at(batch_mode, b, n) for b in batches for n in counts
                   if _global_batch(batch_mode, b, n) >= n})


#: Columns of ``projection.csv``, in order.
PROJECTION_COLUMNS = ['kind', 'model', 'device_type', 'kvstore', 'batch_mode', 'devices',
                      'batch_size', 'per_device_batch', 't_compute_s', 'sync_slope_s',
                      't_sync_s', 't_step_s', 'samples_per_sec', 'speedup', 'efficiency']


def projection_rows(model, device_type, kvstore, batch_mode, batch, compute_s, slope, counts):
    """Project throughput, speedup and efficiency to ``counts`` devices (a model, not measured).

    ``t_step(N) = t_compute(b_N) + s (N - 1)``, throughput ``B_N / t_step(N)``,
    speedup ``throughput(N) / throughput(1)``, efficiency ``speedup / N``,
    with ``b_N = per_device_batch_at(batch_mode, batch, N)`` and ``B_N`` the
    global batch (``batch x N``, or ``batch``). Counts that cannot split a
    fixed global batch are left out.

    (More: lab/NOTES.md.)
    """
    rows = []
    for n in counts:
        global_batch = _global_batch(batch_mode, batch, n)
        if global_batch < n:
            continue
        b = per_device_batch_at(batch_mode, batch, n)
        t_sync = slope * (n - 1)
        t_step = compute_s[b] + t_sync
        rows.append({'kind': 'projection', 'model': model, 'device_type': device_type,
                     'kvstore': kvstore, 'batch_mode': batch_mode, 'devices': n,
                     'batch_size': global_batch, 'per_device_batch': b,
                     't_compute_s': compute_s[b], 'sync_slope_s': slope, 't_sync_s': t_sync,
                     't_step_s': t_step, 'samples_per_sec': global_batch / t_step})
    one = next((r['samples_per_sec'] for r in rows if r['devices'] == 1), None)
    for r in rows:
        r['speedup'] = r['samples_per_sec'] / one if one else None
        r['efficiency'] = r['speedup'] / r['devices'] if one else None
    return rows


def worker_projection(t_step_s, grad_bytes, workers, servers, gbps, largest_bytes=None):
    """Project a parameter-server run to ``workers`` machines (a model, not a measurement).

    (More: lab/NOTES.md.)
    """
    largest = grad_bytes if largest_bytes is None else largest_bytes
    rows = []
    for w in workers:
        t_net = (grad_bytes + largest) * max(1.0, w / servers) / (gbps * 1e9)
        speedup = w * t_step_s / (t_step_s + t_net)
        rows.append({'workers': w, 'servers': servers, 'gbps': gbps, 't_net_s': t_net,
                     't_step_s': t_step_s + t_net, 't_step_min_s': max(t_step_s, t_net),
                     'speedup': speedup, 'efficiency': speedup / w})
    return rows

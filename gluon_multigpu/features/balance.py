"""Sharing each batch among devices of different speed (exercise 2 of d2l 13.6).

The section splits every batch evenly, so a step lasts as long as the slowest
device's share. A ``Split`` is the split function ``train`` uses: ``Split()``
is the book's even split, ``Split(weights)`` fixed shares, ``AutoSplit()``
shares that follow each device's measured speed. ``TimedSplit`` measures
without acting, to see how long each device waits for the others.

The update is the same whatever the shares: the loss is a sum over samples
and ``trainer.step`` divides by the whole batch (tests/training/test_split.py).
"""
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from ..section.devices import split_batch, split_sizes
from ..machinery.training import Hook
from ..errors import DeviceError

__all__ = ['Split', 'TimedSplit', 'AutoSplit', 'make_split']


class Split(Hook):
    """Fixed shares of every batch: even (``weights`` None, the book's) or in proportion to
    ``weights``, one positive number per device.

    A plug-in of ``train``: pass it in ``hooks`` (``hooks=[Split([1, 3])]``).
    It is also a split function: ``split(X, y, devices) -> (X_shards, y_shards)``.
    """

    def __init__(self, weights=None):
        if weights is not None:
            weights = [float(w) for w in weights]
            split_sizes(len(weights), weights)  # refuses weights that are not positive
        self.weights = weights

    def __call__(self, X, y, devices):
        return split_batch(X, y, devices, self.weights)

    def setup(self, run):
        """Plug into ``run``'s step: this split, its ``after_backward``, its evaluation split."""
        self.start(run.net, run.devices)
        run.plug('split', self, self)
        run.after_backward, run.eval_split = self.after_backward, self.evaluation()

    def start(self, net, devices):
        """Check the shares against ``devices`` before training ``net`` (initialised on them)."""
        if self.weights is not None and len(self.weights) != len(devices):
            raise DeviceError(f'{len(self.weights)} split weights for {len(devices)} devices; '
                              'give one weight per device')

    def after_backward(self, net, devices):
        """Called once a step's backward passes are queued, before ``trainer.step``."""

    def evaluation(self):
        """The split function for evaluation: the current shares, no timing.

        A last batch smaller than the device count reaches only the first
        devices (``evaluate_accuracy_gpus``), which then share it by their weights.
        """
        if (weights := self.weights and list(self.weights)) is None:  # a copy, as they are now
            return split_batch
        return lambda X, y, devices: split_batch(X, y, devices, weights[:len(devices)])

    def describe(self):
        """How the batch is shared, e.g. ``even`` or ``weights 1:3``."""
        return 'even' if self.weights is None else \
            'weights ' + ':'.join(f'{w:g}' for w in self.weights)


class TimedSplit(Split):
    """A ``Split`` that times each device's share of a step, every ``every`` steps.

    A timed step first waits until the previous update has reached every
    device, then, once the step's backward passes are queued, waits for each
    device's gradients in a thread of its own: ``times`` gets the seconds each
    device took from the step's start. The slowest device sets the step's
    time; the others wait for it in ``trainer.step`` (their idle time).
    ``train`` calls ``start`` (which learns the parameters to wait for) and
    ``after_backward``; a loop of your own calls them as ``train`` does.

    Parameters
    ----------
    weights : list of float, optional
        Fixed shares, one positive number per device (None: even).
    every : int
        Time one step in ``every`` (the first step of a run is never timed: it builds the
        compiled graph).
    """

    def __init__(self, weights=None, every=10):
        super().__init__(weights)
        if not isinstance(every, int) or every < 1:
            raise DeviceError(f'every must be a positive whole number of steps, got {every!r}')
        # times, sizes: per timed step, the seconds and the samples of each device
        self.every, self.steps, self.times, self.sizes = every, 0, [], []
        self._params, self._sizes, self._start, self._since_change = [], [], None, 0

    def start(self, net, devices):
        super().start(net, devices)
        self._params = [p for p in net.collect_params().values() if p.grad_req != 'null']

    def __call__(self, X, y, devices):
        self.steps, self._since_change, self._start = self.steps + 1, self._since_change + 1, None
        if self._due():
            for data in (p.data(ctx) for p in self._params for ctx in p.list_ctx()):
                data.wait_to_read()  # Sync point: the previous update is done everywhere.
            self._start = time.perf_counter()
        X_shards, y_shards = super().__call__(X, y, devices)
        self._sizes = [s.shape[0] for s in y_shards]
        return X_shards, y_shards

    def _due(self):
        return self._since_change > 1 and self.steps % self.every == 0

    def after_backward(self, net, devices):
        if self._start is None or len(self._sizes) != len(devices):
            return
        # Sync point: each device's gradients, waited for
        self.observe([t - self._start for t in _ready_times(self._params, devices)], self._sizes)

    def observe(self, times, sizes):
        """Record one timed step: each device's ``times`` (seconds) for its ``sizes`` (samples)."""
        self.times.append(times)
        self.sizes.append(sizes)

    def reset_stats(self):
        """Forget the timed steps so far (e.g. at the start of an epoch)."""
        self.times, self.sizes = [], []

    def idle(self):
        """Per device, the share of the timed steps' time it waited for the slowest (0..1)."""
        total = sum(max(t) for t in self.times)
        return [sum(max(t) - x for t, x in zip(self.times, device)) / total
                for device in zip(*self.times)]

    def device_ms(self):
        """Per device, the median milliseconds of its share of a timed step."""
        return [1000 * statistics.median(device) for device in zip(*self.times)]

    def summary(self):
        """A line on the timed steps: shares, each device's time and idle share."""
        if not self.times:
            return f'split {self.describe()}: no step timed yet'
        ms = '/'.join(f'{m:.0f}' for m in self.device_ms())
        idle = '/'.join(f'{100 * i:.0f}%' for i in self.idle())
        return (f'split {self.describe()}: per device {ms} ms a step, idle {idle} '
                f'({len(self.times)} steps timed)')


class AutoSplit(TimedSplit):
    """Shares that follow each device's measured speed, so that all finish a step together.

    Starts even. After a change of the shares the next ``window`` steps are
    timed (the first after a change is skipped: new shard shapes cost a graph
    re-plan); later one step in ``every``. Each ``window`` timed steps it takes
    every device's median speed (samples per second of its share) and, when
    shares in proportion to those speeds would shorten the step by more than
    ``tolerance``, moves to them. Speeds that drift (a device that takes on
    other work) are followed the same way. A change is a prediction (a device's
    time in proportion to its samples), so the window after it checks it: unless
    the step's time per sample fell by at least half of ``tolerance``, the shares
    go back and stay for ``hold`` windows (doubled after each change undone).

    Parameters
    ----------
    every : int
        Once settled, time one step in ``every``.
    window : int
        Timed steps behind each decision.
    tolerance : float
        Smallest predicted gain worth a change, a fraction of the step's time (0 to 1).
    hold : int
        Windows to keep the shares after a change that did not pay.
    """

    def __init__(self, every=10, window=3, tolerance=0.05, hold=5):
        super().__init__(None, every)
        if not isinstance(window, int) or window < 1:
            raise DeviceError(f'window must be a positive whole number, got {window!r}')
        if not 0 <= tolerance < 1:
            raise DeviceError(f'tolerance must be a fraction from 0 to 1, got {tolerance!r}')
        if not isinstance(hold, int) or hold < 0:
            raise DeviceError(f'hold must be a whole number of windows, got {hold!r}')
        self.window, self.tolerance, self.hold = window, tolerance, hold
        self._speeds, self._gains, self._per_sample = [], [], []
        # _trial: the shares before the last change, and their time per sample
        self.changes, self.undone, self._trial, self._holding = 0, 0, None, 0

    def start(self, net, devices):
        super().start(net, devices)
        self.weights = self.weights if self.weights else [1.0] * len(devices)

    def _due(self):  # TimedSplit's steps, and every step of the window after a change
        just_changed = len(self._speeds) < self.window and self._since_change <= 1 + self.window
        return (self._since_change > 1 and just_changed) or super()._due()

    def observe(self, times, sizes):
        super().observe(times, sizes)
        self._speeds.append(speeds := [s / max(t, 1e-9) for s, t in zip(sizes, times)])
        self._gains.append(1 - sum(sizes) / sum(speeds) / max(times))
        self._per_sample.append(max(times) / sum(sizes))
        if len(self._speeds) < self.window:
            return
        speed = [statistics.median(device) for device in zip(*self._speeds)]
        gain, per_sample = (statistics.median(v) for v in (self._gains, self._per_sample))
        self._speeds, self._gains, self._per_sample = [], [], []
        if self._trial is not None:  # the first window after a change: did it pay?
            (before, before_per_sample), self._trial = self._trial, None
            if per_sample > before_per_sample * (1 - self.tolerance / 2):
                self.weights, self.undone, self._since_change = before, self.undone + 1, 0
                self._holding = self.hold * 2 ** (self.undone - 1)
                return
        if self._holding:
            self._holding -= 1
        elif gain > self.tolerance:
            self._trial, self.weights = (self.weights, per_sample), [s / sum(speed) for s in speed]
            self.changes, self._since_change = self.changes + 1, 0

    def describe(self):
        shares = '/'.join(f'{100 * w / sum(self.weights):.0f}%' for w in self.weights or [])
        undone = f', {self.undone} undone' if self.undone else ''
        return f'auto (shares {shares or "even"}, {self.changes} change(s){undone})'


def _ready_times(params, devices):
    """Per device, when all of its gradients were written (``time.perf_counter()``).

    One thread per device waits for that device's gradients, so each device's
    time is its own, whatever order they finish in. Sync point.
    """
    def wait(device):
        for p in params:
            p.grad(device).wait_to_read()  # releases the GIL while it waits
        return time.perf_counter()

    with ThreadPoolExecutor(len(devices)) as pool:  # an error once every thread has ended
        return list(pool.map(wait, devices))


def make_split(split):
    """Return the ``Split`` for ``split``: a ``Split`` as is, None or ``'even'`` the book's,
    ``'auto'`` an ``AutoSplit``, a list of numbers fixed weights."""
    if isinstance(split, Split):
        return split
    if split == 'auto':
        return AutoSplit()
    if isinstance(split, str) and split != 'even':
        raise DeviceError(f'unknown split {split!r}; give `split` even, auto or one weight per '
                          'device')
    return Split(None if split == 'even' else split)

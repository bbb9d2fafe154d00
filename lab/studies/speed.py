"""Training speed on k devices over a bounded number of steps: ``scripts/scaling.py``'s default.

A full run of the sweep trains every configuration to its last epoch (hours
for ResNet-18 on CPU contexts); its speed is known after a few steps. Here a
configuration trains ``warmup`` untimed steps (the first compiles the graph
and creates the kvstore), then ``steps`` timed ones: the section's step
(``section.steps.train_epoch``: split, forward and backward per device,
``trainer.step``) on real batches, from the same seed and data order as the
full run, the timer started and stopped after ``npx.waitall()``. A stop
request is asked before every batch.
"""
import itertools
import time

from gluon_multigpu import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import gluon, npx

from lab.studies import scaling_model as scaling
from lab.studies.measure import build_net
from gluon_multigpu.section.data import train_loader
from lab.studies.counts import devices_for
from gluon_multigpu.section.kvstores import make_trainer
from gluon_multigpu.machinery.pushers import pushers_for
from gluon_multigpu.section.recipes import MAX_IN_FLIGHT
from gluon_multigpu.section.steps import Step, train_epoch
from gluon_multigpu.errors import TrainingDiverged
from lab.studies.sweep import check_stop

__all__ = ['time_steps']


def _batches(loader, stop, advance):
    """The loader's batches, epoch after epoch; ``stop`` asked and ``advance(samples)`` told
    before each."""
    samples = 0
    while True:
        for X, y in loader:
            check_stop(stop)
            samples += X.shape[0]
            if advance is not None:
                advance(samples)
            yield X, y


def time_steps(config, device_type, train_data, steps, seed=0, stop=None, advance=None,
               warmup=scaling.WARMUP_STEPS):
    """Train ``config`` (a ``scaling.Config``) for ``warmup`` + ``steps`` steps; return its
    ``scaling.steps_row`` (status ``diverged`` if the loss became non-finite).

    ``train_data``: uint8 images and int32 labels; fewer than the steps need are
    repeated, epoch after epoch. ``advance(samples)``: the samples queued so
    far (a sweep's estimate).
    """
    devices = devices_for(device_type, config.devices)
    net = build_net(config.model, devices, seed)
    trainer = make_trainer(net, config.lr, config.kvstore)
    batches = _batches(train_loader(*train_data, config.batch_size, config.devices, seed),
                       stop, advance)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def run(n):
        return train_epoch(Step(net, loss, trainer, devices, pushers=pushers,
                                max_in_flight=MAX_IN_FLIGHT), itertools.islice(batches, n))
    with pushers_for(devices) as pushers:  # each CPU context's passes from its own thread
        return _timed(config, device_type, run, warmup, steps)


def _timed(config, device_type, run, warmup, steps):
    """``time_steps``' measurement: ``run(warmup)``, then ``run(steps)`` timed."""
    try:
        if warmup:
            queued = run(warmup)
            npx.waitall()
            queued.totals(0.0)  # a warm-up that diverged is said as such
        tic = time.perf_counter()
        queued = run(steps)
        npx.waitall()  # sync point: every timed step has finished on every device
        totals = queued.totals(time.perf_counter() - tic)
    except TrainingDiverged:
        return scaling.steps_row(config, device_type, None, status='diverged')
    return scaling.steps_row(config, device_type, totals)

"""The parameter server's network model against a shaped network: steps measured and predicted.

``scaling.worker_projection`` predicts what the network adds to a step of
``dist_sync`` training with W workers and S servers on links of bandwidth B.
This study measures it: a ``cluster.Cluster`` of W + 2 hosts (scheduler,
one server, W workers, each on a host of its own, so that no two share a
link) runs ``scripts/launch.py --launcher ssh`` with ``scripts/train.py
--kvstore dist_sync --cpu-devices 1`` on random data of Fashion-MNIST's
shape (``--synthetic``), once with every link unshaped and once with every
link shaped (tbf, both directions) to each bandwidth.

In lab/NOTES.md, under this module's name.
"""
import dataclasses
import os
import time

from lab.hosts import cluster as _cluster
from lab.studies.network_model import BANDWIDTHS, DEFAULT_BATCH, DEFAULT_STEPS, GRAD_BYTES, LARGEST_KEY_BYTES, MODELS, PAYLOAD, QUICK_STEPS, SERVERS, TIMED_EPOCH, TIMED_SECONDS, WORKER_THREADS, Config, estimate_seconds, gradient_bytes, launch_argv, plan, predict, steps_for, train_argv
from lab.studies.network_report import ROW_COLUMNS, markdown_table, table_row
from lab.studies.network_run import Measurement, OthersCPU, measure, others_cores, parse_epochs, step_seconds
from lab.studies.jobs import StudyError, duration

__all__ = ['MODELS', 'GRAD_BYTES', 'LARGEST_KEY_BYTES', 'PAYLOAD', 'DEFAULT_BATCH',
           'DEFAULT_STEPS', 'TIMED_SECONDS', 'QUICK_STEPS', 'BANDWIDTHS', 'SERVERS',
           'TIMED_EPOCH', 'WORKER_THREADS', 'ROW_COLUMNS', 'StudyError', 'Config',
           'gradient_bytes', 'plan', 'steps_for', 'train_argv', 'launch_argv', 'parse_epochs',
           'step_seconds', 'predict', 'table_row', 'markdown_table', 'estimate_seconds',
           'OthersCPU', 'others_cores', 'Measurement', 'measure', 'study']


def study(runs, workdir, say=None, log_dir=None, max_others=0.25, retries=2, quiet_wait=120.0):
    """Run the study; yield ``(row, measurements)`` for each shaped run as it is measured.

    (More: lab/NOTES.md.)
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
                config = _announce(config, flat[done - 1:], f'[{done}/{total}]', unshaped, say)
                best = _measure_best(cl, config, workdir, say, log_dir, max_others, retries,
                                     quiet_wait)
                if config.bandwidth is None:
                    base_runs[(config.model, workers)] = best
                    if best.step_s is not None:
                        unshaped[(config.model, workers)] = best.step_s
                    continue
                yield _row(config, best, base_runs.get((config.model, workers)))


def _announce(config, rest, count, unshaped, say):
    """``config`` with its steps chosen (``steps_for``), said with the estimates of its time and
    of the ``rest`` of the study (itself first); ``count`` is ``[done/total]``."""
    left = sum(estimate_seconds(c, unshaped.get((c.model, c.workers))) for c in rest)
    unshaped_s = unshaped.get((config.model, config.workers))
    config = dataclasses.replace(config, steps=steps_for(config, unshaped_s))
    say(f'{count} {config.label}: batch {config.batch} per worker, '
        f'{TIMED_EPOCH} epochs of {config.steps} steps; about '
        f'{duration(estimate_seconds(config, unshaped_s))} '
        f'for it, {duration(left)} for the rest of the study')
    return config


def _measure_best(cl, config, workdir, say, log_dir, max_others, retries, quiet_wait):
    """``measure`` ``config``, again while it failed or others disturbed it (at most
    ``retries`` times more); the ``Measurement`` kept (``_better``)."""
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
    return best


def _row(config, best, base):
    """The study's ``(row, measurements)`` of shaped run ``config`` (its ``best`` Measurement),
    beside ``base``, its model's unshaped run on the same workers (None if there is none)."""
    base_s = base.step_s if base else None
    status = best.status if best.status != 'ok' else (
        'ok' if base_s is not None else 'no unshaped step')
    row = table_row(config, base_s, best.step_s,
                    max(best.others_cores, base.others_cores if base else 0.0), status)
    return row, ([base.to_dict()] if base else []) + [best.to_dict()]


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

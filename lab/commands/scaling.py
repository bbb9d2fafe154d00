"""Sweep device counts, batch sizes, learning-rate rules, kvstores: speed and accuracy on k devices.

Exercise 1 of d2l 13.6 as a tool. By default each configuration trains a
bounded number of steps (``--steps``) from the same seed on the same data, and
its speed is measured: minutes in all. With ``--full`` each configuration is a
whole training run (``gluon_multigpu.train``) with its final test accuracy:
hours for ResNet-18 on CPU contexts. The output directory gets scaling.csv
(one row per configuration: seconds per step or per epoch, samples/s,
speedup, efficiency; with --full the final test accuracy), speedup.png,
efficiency.png, accuracy.png (--full), a projection to 16 devices from a
stated model (projection.csv, fitted to the synchronisations in sync.csv) and
report.md, which answers how many devices to use and which kvstore is faster.
"""
import os
import sys
import types

# What loads MXNet (or matplotlib) is imported where it is first used: after the engine
# settings (common.prepare_engine).  pylint: disable=import-outside-toplevel
from lab.commands import common
from lab.commands import sweeps
from lab.commands.bandwidth import engine_description
from lab.commands.common import int_in, non_negative_float, num_epochs, positive_float
from lab.studies.counts import device_counts, devices_for, resolve_counts
from gluon_multigpu.errors import GluonMultiGPUError
from lab.studies import sweep as sweep_module
from gluon_multigpu.filesafety.lockfile import Lock
from gluon_multigpu.filesafety.targets import check_outputs
from lab.studies.scaling_model import LR_RULES, MEASURED_COLUMNS, PROJECTION_COLUMNS, SYNC_COLUMNS, \
    WARMUP_STEPS, add_speedups, build_grid, projection_batches

#: Timed training steps of a speed measurement by default (``--steps``).
STEPS = 10
#: How long the default took with ResNet-18 on CPU contexts 1 and 2 on the project's 2-core
#: machine shared with other jobs (297 s, its first measurement kept after 113 s), and the
#: estimate of a --full sweep there (5.4-5.6 h), for ``--help``.
QUICK_TIME, FIRST_TIME, FULL_TIME = '5 minutes', '2 minutes', '5.5 hours'

EPILOG = f"""\
what it measures:
  by default    the training speed of every configuration over --steps N timed steps
                (default {STEPS}, after {WARMUP_STEPS} untimed ones), then the projection's inputs
                (one device's step, one synchronisation at each count): about {QUICK_TIME}
                with the defaults (ResNet-18, CPU contexts 1 and 2) on 2 cores shared with
                other jobs, the first measurement kept after about {FIRST_TIME}. Speed
                only: no test accuracy.
  --full        every configuration trains --num-epochs epochs over the data and its final
                test accuracy is measured: hours with ResNet-18 on CPU contexts (estimated
                at about {FULL_TIME} with the defaults on 2 cores); for how accuracy depends
                on the batch size and the learning-rate rule.

definitions:
  samples/s     training samples per second up to npx.waitall(), evaluation excluded: over
                the --steps timed steps, or (--full) every epoch but the first when there
                are two or more
  speedup       samples/s on N devices / samples/s of the 1-device run with the same kvstore,
                lr rule and per-device batch (with --global-batch: the same global batch);
                empty when 1 is not among the counts
  efficiency    speedup / N
  lr rules      B = global batch: linear = base x B/256 (the book), fixed = base,
                sqrt = base x sqrt(B/256)
  projection    a model, not a measurement: t_step(N) = t_compute(b) + s (N - 1), with
                t_compute measured on one device and s fitted to synchronisations measured
                at the counts of the sweep (see report.md for its assumptions)

examples:
  %(prog)s --num-gpus 4                      GPUs 1, 2, 4; ResNet-18, batch 256 per GPU
  %(prog)s --cpu-devices 2 --kvstores local device    speed of each, 1 and 2 contexts
  %(prog)s --full --cpu-devices 2 --model simple-cnn --num-epochs 2 --num-train 6000 \\
      --batch-per-device 64 128 --lr-rule linear sqrt --kvstores local device --out sweep/
  %(prog)s --counts 1 2 4 --global-batch 512 --lr-rule fixed

Bad input (device counts that do not exist, a batch that cannot be split, missing
or corrupt data, an output directory whose parent does not exist or is not
writable, a batch whose estimated memory exceeds what is available) stops before
training with one line on stderr and exit status 2. Once the first measurement
has run a few seconds, a line gives the estimate for the whole sweep and faster
alternatives; a line every --progress-interval seconds names the measurement
and the time left in the whole sweep. Each measurement is kept in --results
(default DIR/results.json, marked partial until the sweep is complete) as soon
as it ends: Ctrl-C, SIGTERM or SIGHUP is acknowledged at once, stops after the
current step, prints the partial table and says in one line what was kept and
how to continue (--resume: the measurements kept are not made again), status
130, 143 or 129; a second Ctrl-C stops at once. The report files are written
when every measurement has finished, all or nothing; a disk that fills stops
with one line naming the file and status 1. GLUON_MULTIGPU_MEMORY_AVAILABLE
(bytes) replaces the system's available memory in the memory check.
"""


#: The files of the report in --out (written at the end): --results may not take their names.
REPORT_FILES = ('scaling.csv', 'projection.csv', 'sync.csv', 'speedup.png', 'efficiency.png',
                'accuracy.png', 'report.md')
#: Samples per device per step by default: the book's 256 on GPUs; on CPU contexts 64, which
#: keeps ResNet-18 on 2 contexts near 3 GB (256 would need about 9 GB).
GPU_BATCH, CPU_BATCH = 256, 64


def build_parser():
    """Return the argument parser of this script."""
    from gluon_multigpu.section.data import DATASETS
    from gluon_multigpu.section.kvstores import KVSTORES
    from gluon_multigpu.section.model import MODELS
    p = common.sweep_parser(__doc__, EPILOG, 1, 'up to the number of cores', 'run, e.g. 1 2 4')
    batch = p.add_mutually_exclusive_group()
    batch.add_argument('--batch-per-device', type=int_in(1, 100_000), nargs='+', metavar='B',
                       help='samples per device per step; the global batch is B x devices, as '
                       f"the book scales it (default: {GPU_BATCH}, the book's, on GPUs; "
                       f'{CPU_BATCH} on CPU contexts, less where the memory available holds '
                       'less); on CPU contexts a batch whose estimated memory exceeds what is '
                       'available is refused')
    batch.add_argument('--global-batch', type=int_in(1, 1_000_000), nargs='+', metavar='B',
                       help='fixed global batches instead, split across the devices')
    p.add_argument('--lr-rule', nargs='+', choices=LR_RULES, default=['linear'],
                   metavar='RULE', help='learning-rate rules to try: '
                   f'{", ".join(LR_RULES)} (default: linear)')
    p.add_argument('--base-lr', type=positive_float, default=0.1, metavar='LR',
                   help='SGD learning rate at a global batch of 256 (default: 0.1, the book)')
    p.add_argument('--kvstores', nargs='+', choices=KVSTORES, default=['device'],
                   metavar='KV', help='gradient synchronisation: local, device, nccl (GPUs with '
                   'an NCCL build) or none (default: device)')
    mode = p.add_mutually_exclusive_group()
    mode.add_argument('--steps', type=int_in(1, 100_000), default=STEPS, metavar='N',
                      help='timed training steps of each configuration, after '
                      f'{WARMUP_STEPS} untimed ones (default: {STEPS}): its speed, in minutes')
    mode.add_argument('--full', action='store_true',
                      help='train every configuration --num-epochs epochs instead, and measure '
                      'its final test accuracy too (hours with ResNet-18 on CPU contexts)')
    p.add_argument('--num-epochs', type=num_epochs, default=10, metavar='N',
                   help='epochs of every run with --full (default: 10)')
    p.add_argument('--rounds', type=int_in(1, 20), default=2, metavar='N',
                   help='measurements of each configuration\'s speed, the configurations taken '
                   'in turn round after round (every other round backwards); the kvstores are '
                   'compared by the rounds they share, and a winner named only when the interval '
                   'excludes 1 (default: 2; --full trains each configuration once)')
    common.add_run_flags(p, MODELS, DATASETS)
    p.add_argument('--download', action='store_true',
                   help="download missing files into --data-dir from MXNet's mirror (needs "
                   'internet)')
    p.add_argument('--project-to', type=int_in(1, 1024), default=16, metavar='N',
                   help='project to 1, 2, 4, ... N devices (default: 16, a p2.16xlarge)')
    p.add_argument('--compute-repeats', type=int_in(1, 1000), default=5, metavar='N',
                   help='timed training steps (forward, backward, update) on one device for '
                   'the projection; the median is used (default: 5)')
    p.add_argument('--sync-repeats', type=int_in(1, 1000), default=5, metavar='N',
                   help='timed synchronisations per kvstore and count for the projection '
                   '(default: 5)')
    p.add_argument('--out', metavar='DIR', default='scaling-report',
                   help='output directory (default: scaling-report), created at the first '
                   'measurement if missing; its parent must exist')
    p.add_argument('--progress-interval', type=non_negative_float, default=10.0, metavar='SECONDS',
                   help='seconds between progress lines on stderr; 0 turns them off '
                   '(default: 10)')
    common.add_sweep_flags(p, 'DIR/results.json, DIR the --out directory')
    return p


def fit_batches(args, device_type, counts, batches, given, available, say):
    """The batches to sweep: each must fit in memory at the largest count on CPU contexts.

    A default that does not fit is halved until it fits, with a line; a given
    batch that does not fit is refused with one line (``DeviceError``).
    """
    if device_type != 'cpu' or available is None:
        return batches
    from gluon_multigpu.section.model import memory_needed
    largest, per_device = max(counts), not args.global_batch

    def need(b):
        return memory_needed(args.model, b * largest if per_device else b, largest)
    flag = '--batch-per-device' if per_device else '--global-batch'
    fitted = [sweep_module.fit_to_memory(
        b, need, available, f'{args.model} on {largest} CPU contexts with a '
        + (f'batch of {b} per device' if per_device else f'global batch of {b}'), flag,
        'free memory, or sweep fewer --counts', given, say, 'sweeping {}') for b in batches]
    return list(dict.fromkeys(fitted))


def faster_advice(args, counts, num_train):
    """The faster alternatives to a sweep."""
    options = []
    if args.model != 'simple-cnn':
        options.append('--model simple-cnn (about 60 times faster)')
    if not args.full and args.steps > 5:
        options.append('--steps 5')
    if args.full and num_train > 6000:
        options.append('--num-train 6000 --num-test 1000')
    if args.full and args.num_epochs > 2:
        options.append('--num-epochs 2')
    if len(counts) > 2:
        options.append(f'--counts {counts[0]} {counts[1]}')
    return ', '.join(options)


def result_ok(unit, result):
    """Whether ``result``, read back from --results, is what ``unit`` measures (``Sweep.check``)."""
    rows_ok = sweep_module.rows_ok
    if unit.key == 'projection':
        return isinstance(result, dict) and \
            rows_ok(result.get('projection'), PROJECTION_COLUMNS) and \
            rows_ok(result.get('sync'), SYNC_COLUMNS)
    return rows_ok([result], MEASURED_COLUMNS)


def make_sweep(args, grid, device_type, counts, batch_mode, batches, train_data, num_test, say):
    """The sweep's units: one per configuration (its speed over --steps, or with --full a
    training run), then the projection's inputs."""
    from lab.studies.measure import MODEL_COST, config_label
    cost = MODEL_COST[args.model]
    if args.full:
        work = cost * args.num_epochs * (len(train_data[1]) + num_test / 3)
        units = [sweep_module.Unit(config_key(c), config_label(c), work) for c in grid]
    else:  # round after round, every other one backwards: a drifting load falls on all
        units = [sweep_module.Unit(f'{r + 1}/{config_key(c)}',
                                   f'round {r + 1}/{args.rounds}, {config_label(c)}: speed over '
                                   f'{args.steps} steps',
                                   cost * (args.steps + WARMUP_STEPS) * c.batch_size)
                 for r in range(args.rounds) for c in (grid if r % 2 == 0 else grid[::-1])]
    if any(n >= 2 for n in counts):
        targets = device_counts(args.project_to)
        compute = sum(projection_batches(batch_mode, batches, targets))
        units.append(sweep_module.Unit(
            'projection', 'projection inputs: synchronisations and one device\'s steps',
            cost * (args.compute_repeats + 1) * compute
            + cost * sum(4 * n for n in counts if n >= 2) * len(args.kvstores)))
    config = {'model': args.model, 'dataset': args.dataset, 'num_train': len(train_data[1]),
              'num_test': num_test, 'epochs': args.num_epochs, 'seed': args.seed,
              'device_type': device_type, 'counts': counts, 'base_lr': args.base_lr,
              'kvstores': list(dict.fromkeys(args.kvstores)), 'batch_mode': batch_mode,
              'batches': batches, 'lr_rules': list(dict.fromkeys(args.lr_rule)),
              'project_to': args.project_to, 'compute_repeats': args.compute_repeats,
              'sync_repeats': args.sync_repeats}
    if not args.full:  # a --full run's settings are as they were before the speed default
        config.update(mode='speed', steps=args.steps, epochs=None, rounds=args.rounds)
    return sweep_module.Sweep(
        args.results or os.path.join(args.out, 'results.json'), 'scaling', config, units, say,
        resume=args.resume, overwrite=args.overwrite, check=result_ok,
        advice=faster_advice(args, counts, len(train_data[1])),
        interval=args.progress_interval, first_estimate=30.0,  # past the first compilation
        # --out, made at the start (removed if nothing was measured)
        make_folder=args.results is None or sweeps.in_out_folder(args.results, args.out))


def config_key(config):
    """A configuration's key in the results file."""
    return (f'{config.kvstore}/{config.batch_mode}/{config.batch_size}/{config.lr_rule}/'
            f'{config.devices}')


def say(line):
    """Print a progress line on stderr at once (nothing, quietly, if the terminal is gone)."""
    common.say_quietly(line)


def print_tables(rows, projection, out):
    """The measured table, the answers, and the projection's table."""
    from lab.studies import scaling_report
    print(scaling_report.scaling_table(rows), file=out)
    print('', *scaling_report.how_many_devices(rows), file=out, sep='\n')
    kv_lines = scaling_report.fastest_kvstores(rows)
    if kv_lines:
        print('', 'local or device:', *kv_lines, file=out, sep='\n')
    if projection:
        print('', 'Projection (a model, not a measurement; assumptions in report.md):',
              scaling_report.projection_table(projection, rows), file=out, sep='\n')
    out.flush()


def run(args, out=None, stop=None):
    """Check the input, run the sweep (each run kept in --results as it ends) and the
    projection's measurements, write the report. ``stop``: a ``StopRequest``."""
    from gluon_multigpu.section.data import input_files
    out = out or sys.stdout
    check_outputs(files=sweeps.results_output(args.results, args.out, REPORT_FILES),
                  directories=[('--out', args.out)],
                  inputs=input_files(args.dataset, args.data_dir))
    with out_lock(args.out, say):
        return measure_and_report(args, out, stop)


def out_lock(folder, say):
    """The lock of the --out folder ``folder`` (``.NAME.lock`` beside it): one run at a time."""
    parent, name = os.path.split(os.path.abspath(folder))
    return Lock(os.path.join(parent, f'.{name}.lock'),
                         held=lambda who: f'another run{who} is writing the report in --out '
                                          f'{folder}; wait until it ends, or give another --out',
                         fix='give another --out', say=say)


def plan_sweep(args):
    """What the sweep measures, from the command line, checked before any data is read: the
    device type, ``counts``, a ``note`` on them (or None), the ``kvstores``, the ``batch_mode``,
    the ``batches`` (fitted to the memory available) and the configurations' ``grid``."""
    from gluon_multigpu.section.kvstores import check_kvstore
    device_type, counts, note = resolve_counts(
        args.num_gpus, args.cpu_devices, args.counts, cpu_default=device_counts(common.cores()))
    kvstores = list(dict.fromkeys(args.kvstores))
    for kvstore in kvstores:
        check_kvstore(kvstore, devices_for(device_type, counts[0]))
    batch_mode = 'global' if args.global_batch else 'per-device'
    given = args.global_batch or args.batch_per_device
    batches = list(dict.fromkeys(given or [GPU_BATCH if device_type == 'gpu' else CPU_BATCH]))
    batches = fit_batches(args, device_type, counts, batches, bool(given),
                          sweeps.available_memory(), say)
    grid = build_grid(args.model, counts, kvstores, list(dict.fromkeys(args.lr_rule)),
                      args.base_lr, args.num_epochs, batches, batch_mode)
    return types.SimpleNamespace(device_type=device_type, counts=counts, note=note,
                                 kvstores=kvstores, batch_mode=batch_mode, batches=batches,
                                 grid=grid)


def sweep_data(args, devices):
    """The training and test images and labels of every run, as NumPy array pairs; enough
    training images to split across ``devices`` (the most of a sweep's counts)."""
    from gluon_multigpu.section.data import load_data
    train_iter, test_iter = load_data(args.dataset, 1, root=args.data_dir, download=args.download,
                                      num_train=args.num_train, num_test=args.num_test)
    if (num_train := len(train_iter.labels)) < devices:
        raise GluonMultiGPUError(f'{num_train} training images cannot be split across '
                                 f'{devices} devices; raise `num_train`')
    return (train_iter.images, train_iter.labels), (test_iter.images, test_iter.labels)


def unit_measure(args, plan, sweep, train_data, test_data, stop):
    """How to measure one unit of the sweep: a configuration's speed over --steps (or with
    --full its training run), or the projection's inputs."""
    from lab.studies import measure
    from lab.studies import speed
    configs = {config_key(c): c for c in plan.grid}
    cost = measure.MODEL_COST[args.model]

    def measure_unit(unit):
        if unit.key == 'projection':
            projection, sync_rows = measure.measure_projection(
                args.model, plan.device_type, plan.counts, plan.kvstores, plan.batch_mode,
                plan.batches, *train_data, project_to=args.project_to,
                compute_repeats=args.compute_repeats, sync_repeats=args.sync_repeats,
                seed=args.seed, progress=say, stop=stop)
            return {'projection': projection, 'sync': sync_rows}
        if not args.full:
            return speed.time_steps(configs[unit.key.split('/', 1)[1]], plan.device_type,
                                    train_data, args.steps, args.seed, stop,
                                    lambda done: sweep.advance(cost * done))
        work = measure.WorkDone(lambda done: sweep.advance(cost * done), len(train_data[1]))
        # No progress lines of its own: the sweep's line says the time left, for the whole sweep.
        return measure.train_config(configs[unit.key], plan.device_type, train_data, test_data,
                                    args.seed, say, 0, [h for h in (stop, work) if h is not None])
    return measure_unit


def measured_rows(results):
    """The rows of the training runs among the sweep's ``results``, with their speedups.

    A configuration measured in several rounds is one row: the round of its
    median speed, with ``rounds``, its samples/s in every round (in order),
    which the kvstore answer pairs (``scaling_report.fastest_kvstores``).
    """
    by_config = {}
    for unit, r in results:
        if unit.key == 'projection':
            continue
        parts = unit.key.split('/')
        round_ = int(parts[0]) if len(parts) == 6 else 1  # a --full run's key has no round
        by_config.setdefault('/'.join(parts[-5:]), []).append((round_, dict(r)))
    rows = []
    for measured in by_config.values():
        measured.sort(key=lambda m: m[0])
        speeds = [r['samples_per_sec'] for _, r in measured]
        ok = sorted((r for _, r in measured if r['samples_per_sec']),
                    key=lambda r: r['samples_per_sec'])
        row = dict(ok[(len(ok) - 1) // 2] if ok else measured[-1][1])  # the lower median
        if len(measured) > 1:
            row['rounds'] = speeds
        rows.append(row)
    return add_speedups(rows)


def measure_and_report(args, out, stop):
    """Measure (each run kept in --results as it ends) and write the report in --out."""
    from lab.studies import scaling_report
    plan = plan_sweep(args)
    train_data, test_data = sweep_data(args, plan.counts[-1])
    sweep = make_sweep(args, plan.grid, plan.device_type, plan.counts, plan.batch_mode,
                       plan.batches, train_data, len(test_data[1]), say)
    notes = []
    if plan.note:
        note = GluonMultiGPUError(plan.note).describe(common.flag)  # the flags, not parameters
        notes.append(note)
        say(note)

    def partial(results):
        print(sweeps.partial_heading(sweep), file=out)
        print_tables(measured_rows(results), None, out)
    results = sweeps.measure_sweep(
        sweep, unit_measure(args, plan, sweep, train_data, test_data, stop), stop, partial)
    rows = measured_rows(results)
    kept = next((r for u, r in results if u.key == 'projection'), None)
    projection, sync_rows = (kept['projection'], kept['sync']) if kept else ([], [])
    if 1 not in plan.counts:
        notes.append('No 1-device run in the sweep: speedup and efficiency are left empty.')
    config = dict(sweep.config, engine=engine_description(plan.device_type))
    print_tables(rows, projection, out)
    # Written last: the figures above are shown even when the disk is full.
    scaling_report.write_scaling_outputs(args.out, config, rows, projection, sync_rows, notes)
    print(f'\nwrote {os.path.join(args.out, "report.md")} and its files', file=out)
    return rows, projection


def main(argv=None):
    """Run the script; return the exit status.

    0 when done; 1 when the report cannot be written (a disk that fills); 2
    for bad input; 128 + the signal (130 for Ctrl-C) when stopped by a signal.
    """
    return sweeps.sweep_main(argv, build_parser, run, 'scaling')


def start(launcher=None):
    """The program: ``python scripts/scaling.py`` (``launcher``: its path)."""
    common.start(main, launcher)


if __name__ == '__main__':
    start()

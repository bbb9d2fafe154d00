"""Sweep device counts, batch sizes, learning-rate rules, kvstores: speed and accuracy on k devices.

Exercise 1 of d2l 13.6 as a tool. Every configuration is a real training run
(``gluon_multigpu.train``) on the same data subset and seed. The output
directory gets scaling.csv (one row per run: seconds per epoch, samples/s,
speedup, efficiency, final test accuracy), speedup.png, efficiency.png,
accuracy.png, a projection to 16 devices from a stated model
(projection.csv, fitted to the synchronisations in sync.csv) and report.md,
which answers how many devices to use and which kvstore is faster.
"""
import os
import sys

import gluon_multigpu as gm  # loads MXNet only when a name needs it: after the engine settings
from . import common
from .bandwidth import engine_description
from .common import int_in, non_negative_float, num_epochs, positive_float, stopping_main

EPILOG = """\
definitions:
  samples/s     training samples per second up to npx.waitall(), evaluation excluded, over
                every epoch but the first when there are two or more
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
  %(prog)s --cpu-devices 2 --model simple-cnn --num-epochs 2 --num-train 6000 \\
      --batch-per-device 64 128 --lr-rule linear sqrt --kvstores local device --out sweep/
  %(prog)s --counts 1 2 4 --global-batch 512 --lr-rule fixed

Bad input (device counts that do not exist, a batch that cannot be split, missing
or corrupt data, an output directory whose parent does not exist or is not
writable) stops before training with one line on stderr and exit status 2. The
output directory is written only when every run has finished, all or nothing:
Ctrl-C or SIGTERM stops with one line and status 130 or 143, a disk that fills
with one line naming the file and status 1, and either leaves it as it was.
"""


def build_parser():
    """Return the argument parser of this script."""
    p = common.sweep_parser(__doc__, EPILOG, 1, 'up to the number of cores', 'run, e.g. 1 2 4')
    batch = p.add_mutually_exclusive_group()
    batch.add_argument('--batch-per-device', type=int_in(1, 100_000), nargs='+', metavar='B',
                       help='samples per device per step; the global batch is B x devices, as '
                       "the book scales it (default: 256, the book's)")
    batch.add_argument('--global-batch', type=int_in(1, 1_000_000), nargs='+', metavar='B',
                       help='fixed global batches instead, split across the devices')
    p.add_argument('--lr-rule', nargs='+', choices=gm.scaling.LR_RULES, default=['linear'],
                   metavar='RULE', help='learning-rate rules to try: '
                   f'{", ".join(gm.scaling.LR_RULES)} (default: linear)')
    p.add_argument('--base-lr', type=positive_float, default=0.1, metavar='LR',
                   help='SGD learning rate at a global batch of 256 (default: 0.1, the book)')
    p.add_argument('--kvstores', nargs='+', choices=gm.KVSTORES, default=['device'],
                   metavar='KV', help='gradient synchronisation: local, device, nccl (GPUs with '
                   'an NCCL build) or none (default: device)')
    p.add_argument('--num-epochs', type=num_epochs, default=10, metavar='N',
                   help='epochs of every run (default: 10)')
    common.add_run_flags(p, gm.MODELS, gm.DATASETS)
    p.add_argument('--project-to', type=int_in(1, 1024), default=16, metavar='N',
                   help='project to 1, 2, 4, ... N devices (default: 16, a p2.16xlarge)')
    p.add_argument('--compute-repeats', type=int_in(1, 1000), default=5, metavar='N',
                   help='timed training steps (forward, backward, update) on one device for '
                   'the projection; the median is used (default: 5)')
    p.add_argument('--sync-repeats', type=int_in(1, 1000), default=5, metavar='N',
                   help='timed synchronisations per kvstore and count for the projection '
                   '(default: 5)')
    p.add_argument('--out', metavar='DIR', default='scaling-report',
                   help='output directory, created at the end if missing; its parent must '
                   'exist (default: scaling-report)')
    p.add_argument('--progress-interval', type=non_negative_float, default=10.0, metavar='SECONDS',
                   help='seconds between progress lines within an epoch on stderr; 0 turns '
                   'them off (default: 10)')
    return p


def run(args, out=None):
    """Check the input, run the sweep and the projection's measurements, write the report."""
    out = out or sys.stdout
    gm.files.check_outputs(directories=[('--out', args.out)])
    cores = common.cores()
    device_type, counts, note = gm.devices.resolve_counts(
        args.num_gpus, args.cpu_devices, args.counts, cpu_default=gm.devices.device_counts(cores))
    kvstores = list(dict.fromkeys(args.kvstores))
    for kvstore in kvstores:
        gm.kvstores.check_kvstore(kvstore, gm.devices.devices_for(device_type, counts[0]))
    batch_mode = 'global' if args.global_batch else 'per-device'
    batches = list(dict.fromkeys(args.global_batch or args.batch_per_device or [256]))
    grid = gm.scaling.build_grid(args.model, counts, kvstores, list(dict.fromkeys(args.lr_rule)),
                              args.base_lr, args.num_epochs, batches, batch_mode)
    train_iter, test_iter = gm.load_data(args.dataset, 1, root=args.data_dir,
                                         num_train=args.num_train, num_test=args.num_test)
    train_data = (train_iter.images, train_iter.labels)
    if len(train_data[1]) < counts[-1]:
        raise gm.GluonMultiGPUError(f'{len(train_data[1])} training images cannot be split '
                                    f'across {counts[-1]} devices; raise --num-train')

    def say(line):
        print(line, file=sys.stderr, flush=True)
    notes = [note] if note else []
    if note:
        say(note)
    rows = gm.measure.run_sweep(grid, device_type, train_data, (test_iter.images, test_iter.labels),
                             seed=args.seed, progress=say, progress_interval=args.progress_interval)
    gm.scaling.add_speedups(rows)
    if 1 not in counts:
        notes.append('No 1-device run in the sweep: speedup and efficiency are left empty.')
    projection, sync_rows = gm.measure.measure_projection(
        args.model, device_type, counts, kvstores, batch_mode, batches, *train_data,
        project_to=args.project_to, compute_repeats=args.compute_repeats,
        sync_repeats=args.sync_repeats, seed=args.seed, progress=say)
    config = {'model': args.model, 'dataset': args.dataset, 'num_train': len(train_data[1]),
              'num_test': len(test_iter.labels), 'epochs': args.num_epochs, 'seed': args.seed,
              'device_type': device_type, 'counts': counts, 'base_lr': args.base_lr,
              'engine': engine_description(device_type), 'project_to': args.project_to,
              'compute_repeats': args.compute_repeats, 'sync_repeats': args.sync_repeats}
    print(gm.scaling_report.scaling_table(rows), file=out)
    print('', *gm.scaling_report.how_many_devices(rows), file=out, sep='\n')
    kv_lines = gm.scaling_report.fastest_kvstores(rows)
    if kv_lines:
        print('', 'local or device:', *kv_lines, file=out, sep='\n')
    if projection:
        print('', 'Projection (a model, not a measurement; assumptions in report.md):',
              gm.scaling_report.projection_table(projection, rows), file=out, sep='\n')
    # Written last: the figures above are shown even when the disk is full.
    gm.scaling_report.write_scaling_outputs(args.out, config, rows, projection, sync_rows, notes)
    print(f'\nwrote {os.path.join(args.out, "report.md")} and its files', file=out)
    return rows, projection


def main(argv=None):
    """Run the script; return the exit status.

    0 when done; 1 when the report cannot be written (a disk that fills); 2
    for bad input; 130 or 143 when stopped by SIGINT or SIGTERM.
    """
    return stopping_main(argv, build_parser, run)


def start(launcher=None):
    """The program: ``gluon-multigpu-scaling``, or ``scripts/scaling.py`` (``launcher``)."""
    common.start(main, launcher)


if __name__ == '__main__':
    start()

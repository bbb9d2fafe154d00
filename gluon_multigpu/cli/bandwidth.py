"""Measure what one gradient synchronisation costs, against the compute of one training step.

For ResNet-18 (11,175,818 trainable parameters) and the simple CNN, for each
kvstore and device count: the seconds of one ``trainer.allreduce_grads()``
(a Trainer with ``update_on_kvstore=False``; the package's ReducingTrainer
for ``none``) on gradients filled by a real forward and backward pass, the
bandwidth that makes, and its ratio to the forward and backward pass of one
step on all devices. d2l 13.6 argues that ResNet-18 gains from more GPUs
because its computation dwarfs its synchronisation; this prints that ratio.
"""
import os
import sys

import gluon_multigpu as gm  # loads MXNet only when a name needs it: after the engine settings
from . import common
from .common import int_in, seed, stopping_main

EPILOG = """\
figures (GB = 1e9 bytes):
  gradient bytes   4 bytes x trainable parameters (float32)
  sync ms          median over --repeats of one allreduce_grads(), ended by npx.waitall()
  alg GB/s         gradient bytes / sync seconds
  bus GB/s         2 (N - 1) / N x alg GB/s, the all-reduce convention for N devices
  compute ms       median forward + backward of --batch-per-device samples on each of the
                   N devices at once, ended by npx.waitall()
  sync / compute   how much one synchronisation adds to a step's computation

examples:
  %(prog)s                                  GPUs 2, 4, ... all; or CPU contexts 2 and 4
  %(prog)s --cpu-devices 4 --quick          CPU contexts 2 and 4, small batch, 2 repeats
  %(prog)s --counts 2 8 --kvstores device nccl --csv bw.csv --json bw.json

Bad input (a count of devices that do not exist, nccl without NCCL or GPUs,
missing or corrupt data, an output path that cannot be written, --csv and --json
naming the same file) stops before measuring with one line on stderr and exit
status 2. Ctrl-C or SIGTERM stops with one line and status 130 or 143, a disk
that fills while writing with one line naming the file and status 1; either
way no file is written (both or neither).
"""


def engine_description(device_type):
    """Say which engine settings the measurements ran under (for reports)."""
    if device_type == 'gpu':
        return ('GPUs, MXNET_ENABLE_GPU_P2P='
                f"{os.environ.get('MXNET_ENABLE_GPU_P2P', '1 (default)')}")
    threads = os.environ.get('OMP_NUM_THREADS', "MXNet's default (half the cores)")
    return (f'CPU contexts on {common.cores()} core(s), OMP_NUM_THREADS={threads} per context in '
            'every run, MXNET_CPU_TEMP_COPY='
            f"{os.environ.get('MXNET_CPU_TEMP_COPY', '4 (default)')}; each context stands for "
            'one device of a fixed size, so fewer contexts leave cores idle and more contexts '
            'than cores share them')


def build_parser():
    """Return the argument parser of this script."""
    p = common.sweep_parser(__doc__, EPILOG, 2, 'counts 2 and 4', 'measure, each at least 2')
    p.add_argument('--models', nargs='+', choices=list(gm.MODELS),
                   default=list(gm.MODELS), metavar='MODEL',
                   help='networks whose parameters are synchronised: '
                   f'{", ".join(gm.MODELS)} (default: both)')
    p.add_argument('--kvstores', nargs='+', choices=gm.KVSTORES, metavar='KV',
                   help='local (sum on the CPU), device (sum on the devices), nccl (GPUs and an '
                   'MXNet build with NCCL) or none (the Trainer sums itself) (default: every one '
                   'this machine can use)')
    p.add_argument('--batch-per-device', type=int_in(1, 100_000), metavar='N',
                   help="samples per device in the compute step (default: 256, the book's; "
                   '8 with --quick)')
    p.add_argument('--repeats', type=int_in(1, 1000), metavar='N',
                   help='timed repeats of each measurement; medians are reported '
                   '(default: 5; 2 with --quick)')
    p.add_argument('--quick', action='store_true',
                   help='small batch and 2 repeats: checks that everything runs (timings rough)')
    p.add_argument('--data-dir', metavar='DIR',
                   help='Fashion-MNIST folder with the four IDX .gz files; its test images feed '
                   'the forward and backward pass (default: ~/.mxnet/datasets/fashion-mnist)')
    p.add_argument('--seed', type=seed, default=0,
                   help='seed of the initial weights (default: 0)')
    p.add_argument('--csv', metavar='PATH', help='write one row per configuration as CSV')
    p.add_argument('--json', metavar='PATH',
                   help='write every figure, with the time of each repeat, as JSON')
    return p


def run(args, out=None):
    """Check the input, measure, print the table, write the files; return the rows."""
    out = out or sys.stdout
    root = os.path.expanduser(args.data_dir or gm.data.default_root('fashion-mnist'))
    gm.files.check_outputs(files=[('--csv', args.csv), ('--json', args.json)],
                           inputs=[os.path.join(root, n) for n in gm.data.IDX_FILES.values()])
    device_type, counts, note = gm.devices.resolve_counts(
        args.num_gpus, args.cpu_devices, args.counts, minimum=2, cpu_default=(2, 4))
    kvstores = list(dict.fromkeys(args.kvstores or gm.measure.usable_kvstores(device_type)))
    for kvstore in kvstores:
        gm.kvstores.check_kvstore(kvstore, gm.devices.devices_for(device_type, counts[0]))
    batch = args.batch_per_device or (8 if args.quick else 256)
    repeats = args.repeats or (2 if args.quick else 5)
    gm.data.check_data_dir(root)
    images, labels = gm.read_split(root, 'test', 'fashion-mnist')
    if note:
        print(note, file=sys.stderr)

    def progress(line):
        print(line, file=sys.stderr, flush=True)
    rows = []
    for model in args.models:
        rows += gm.measure.measure_bandwidth(model, device_type, counts, kvstores, batch, images,
                                          labels, repeats, seed=args.seed, progress=progress)
    print(gm.scaling_report.bandwidth_table(rows), file=out)
    print('', *gm.scaling_report.bandwidth_summary(rows), sep='\n', file=out)
    config = {'device_type': device_type, 'counts': counts, 'kvstores': kvstores,
              'models': args.models, 'batch_per_device': batch, 'repeats': repeats,
              'seed': args.seed, 'engine': engine_description(device_type)}
    written = []
    try:  # both files or neither
        if args.csv:
            gm.files.write_csv(args.csv, rows, gm.scaling.BANDWIDTH_COLUMNS)
            written.append(args.csv)
        if args.json:
            gm.write_json(args.json, {'config': config, 'rows': rows})
    except BaseException:
        for path in written:
            os.remove(path)
        raise
    return rows


def main(argv=None):
    """Run the script; return the exit status.

    0 when done; 1 when an output cannot be written (a disk that fills); 2
    for bad input; 130 or 143 when stopped by SIGINT or SIGTERM.
    """
    return stopping_main(argv, build_parser, run)


def start(launcher=None):
    """The program: ``gluon-multigpu-bandwidth``, or ``scripts/bandwidth.py`` (``launcher``)."""
    common.start(main, launcher)


if __name__ == '__main__':
    start()

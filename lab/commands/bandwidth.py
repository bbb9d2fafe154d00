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

# What loads MXNet (or matplotlib) is imported where it is first used: after the engine
# settings (common.prepare_engine).  pylint: disable=import-outside-toplevel
from lab.commands import common
from lab.commands import sweeps
from lab.commands.common import int_in, seed
from lab.studies.counts import devices_for, resolve_counts
from lab.studies.csvfiles import STAMP_COLUMNS, stamped, write_csv
from gluon_multigpu.errors import GluonMultiGPUError
from lab.studies import sweep as _sweep
from gluon_multigpu.base.machine import stamp
from gluon_multigpu.filesafety.files import write_json
from gluon_multigpu.filesafety.output import replace_together
from gluon_multigpu.filesafety.targets import check_outputs
from lab.studies.scaling_model import BANDWIDTH_COLUMNS

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
naming the same file, a --batch-per-device whose estimated memory exceeds what
is available) stops before measuring with one line on stderr and exit status 2.
After the first measurement a line gives the estimate for the whole run and
faster alternatives; a line every 10 s names what is being measured. Every
measurement is kept in --results as soon as it is made (default:
bandwidth-results.json, marked partial until the run is complete). Ctrl-C,
SIGTERM or SIGHUP is acknowledged at once, stops after the current step,
prints the partial table and says how to continue (--resume: what was measured
is not measured again), status 130, 143 or 129; a second Ctrl-C stops at once.
A disk that fills stops with one line naming the file and status 1. --csv and
--json are written at the end, both or neither. GLUON_MULTIGPU_MEMORY_AVAILABLE
(bytes) replaces the system's available memory in the memory check.
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


#: Samples per device of the compute step: 32 fits an 8 GB machine for ResNet-18 on 4 CPU
#: contexts (3.7 GB peak measured; 64: 5.6 GB; the book's 256: 17 GB); 8 with --quick.
BATCH_PER_DEVICE, QUICK_BATCH = 32, 8


def build_parser():
    """Return the argument parser of this script."""
    from gluon_multigpu.section.kvstores import KVSTORES
    from gluon_multigpu.section.model import MODELS
    p = common.sweep_parser(__doc__, EPILOG, 2, 'counts 2 and 4', 'measure, each at least 2')
    p.add_argument('--models', nargs='+', choices=list(MODELS),
                   default=list(MODELS), metavar='MODEL',
                   help='networks whose parameters are synchronised: '
                   f'{", ".join(MODELS)} (default: both)')
    p.add_argument('--kvstores', nargs='+', choices=KVSTORES, metavar='KV',
                   help='local (sum on the CPU), device (sum on the devices), nccl (GPUs and an '
                   'MXNet build with NCCL) or none (the Trainer sums itself) (default: every one '
                   'this machine can use)')
    p.add_argument('--batch-per-device', type=int_in(1, 100_000), metavar='N',
                   help=f'samples per device in the compute step (default: {BATCH_PER_DEVICE}, '
                   f'less where the memory available holds less; {QUICK_BATCH} with --quick); '
                   'on CPU contexts a batch whose estimated memory exceeds what is available is '
                   'refused')
    p.add_argument('--repeats', type=int_in(1, 1000), metavar='N',
                   help='timed repeats of each measurement; medians are reported '
                   '(default: 5; 2 with --quick)')
    p.add_argument('--quick', action='store_true',
                   help='small batch and 2 repeats: checks that everything runs (timings rough)')
    common.add_data_flags(p, 'its test images feed the forward and backward pass')
    p.add_argument('--seed', type=seed, default=0,
                   help='seed of the initial weights (default: 0)')
    p.add_argument('--csv', metavar='PATH', help='write one row per configuration as CSV')
    p.add_argument('--json', metavar='PATH',
                   help='write every figure, with the time of each repeat, as JSON')
    common.add_sweep_flags(p, RESULTS)
    return p


#: Where the measurements are kept as they are made, unless --results says otherwise.
RESULTS = 'bandwidth-results.json'


def fit_batch(models, device_type, counts, batch, given, available, say):
    """The batch per device to measure with: ``batch`` if its memory fits on CPU contexts.

    A default (``given`` False) that does not fit is halved until it fits,
    with a line; one given that does not fit is refused (``DeviceError``).
    """
    if device_type != 'cpu':
        return batch
    from lab.studies.measure import bandwidth_memory
    largest = max(counts)

    def need(b):
        return max(bandwidth_memory(m, largest, b) for m in models)
    model = max(models, key=lambda m: bandwidth_memory(m, largest, batch))
    return _sweep.fit_to_memory(
        batch, need, available, f'{model} on {largest} CPU contexts with a batch of {batch} per '
        'device', '--batch-per-device', 'free memory, or measure fewer --counts or --models',
        given, say, 'measuring {} per device')


def faster_advice(args, models, counts, batch, repeats):
    """The faster alternatives to a run: --quick, fewer models, counts, repeats."""
    options = []
    if not args.quick:
        options.append(f'--quick ({QUICK_BATCH} per device, 2 repeats)')
    if 'resnet18' in models and len(models) > 1:
        options.append('--models simple-cnn')
    if len(counts) > 1:
        options.append(f'--counts {counts[0]}')
    if repeats > 2:
        options.append('--repeats 2')
    if batch > QUICK_BATCH:
        options.append(f'--batch-per-device {max(QUICK_BATCH, batch // 4)}')
    return ', '.join(options)


def make_sweep(args, device_type, counts, kvstores, batch, repeats, say):
    """The run's units, one per (model, count), kept in --results."""
    from lab.studies.measure import MODEL_COST
    units = [_sweep.Unit(f'{model}/{n}', f'{model} on {n} {device_type} devices: compute of '
                           f'{batch} per device, then one synchronisation per kvstore '
                           f'({", ".join(kvstores)}), {repeats} repeats each',
                           MODEL_COST[model] * n * batch * (repeats + 1))
             for model in args.models for n in counts]
    config = {'device_type': device_type, 'counts': counts, 'kvstores': kvstores,
              'models': args.models, 'batch_per_device': batch, 'repeats': repeats,
              'seed': args.seed}
    return _sweep.Sweep(args.results or RESULTS, 'bandwidth', config, units, say,
                          resume=args.resume, overwrite=args.overwrite,
                          check=lambda unit, rows: _sweep.rows_ok(rows, BANDWIDTH_COLUMNS),
                          advice=faster_advice(args, args.models, counts, batch, repeats))


def say(line):
    """Print a progress line on stderr at once (nothing, quietly, if the terminal is gone)."""
    common.say_quietly(line)


def print_table(rows, out):
    """The table and the summary of ``rows``."""
    from lab.studies.scaling_report import bandwidth_summary, bandwidth_table
    print(bandwidth_table(rows), file=out)
    print('', *bandwidth_summary(rows), sep='\n', file=out, flush=True)


def run(args, out=None, stop=None):
    """Check the input, measure (each measurement kept in --results), print the table, write
    the files; return the rows. ``stop`` (a ``StopRequest``) is asked between repeats."""
    from gluon_multigpu.section.data import input_files, read_split
    from gluon_multigpu.section.kvstores import check_kvstore
    from lab.studies import measure as measuring
    out = out or sys.stdout
    results = args.results or RESULTS
    check_outputs(files=[('--csv', args.csv), ('--json', args.json), ('--results', results)],
                  inputs=input_files('fashion-mnist', args.data_dir))
    device_type, counts, note = resolve_counts(
        args.num_gpus, args.cpu_devices, args.counts, minimum=2, cpu_default=(2, 4))
    kvstores = list(dict.fromkeys(args.kvstores or measuring.usable_kvstores(device_type)))
    for kvstore in kvstores:
        check_kvstore(kvstore, devices_for(device_type, counts[0]))
    repeats = args.repeats or (2 if args.quick else 5)
    batch = fit_batch(args.models, device_type, counts,
                      args.batch_per_device or (QUICK_BATCH if args.quick else BATCH_PER_DEVICE),
                      args.batch_per_device is not None, sweeps.available_memory(), say)
    root = sweeps.data_root(args)
    images, labels = read_split(root, 'test', 'fashion-mnist')
    sweep = make_sweep(args, device_type, counts, kvstores, batch, repeats, say)  # locks --results
    if note:
        say(GluonMultiGPUError(note).describe(common.flag))

    def measure(unit):
        model, n = unit.key.split('/')
        return measuring.measure_count(model, device_type, int(n), kvstores, batch, images,
                                       labels, repeats, seed=args.seed, progress=say, stop=stop)

    def partial(results):
        print(sweeps.partial_heading(sweep), file=out)
        print_table([r for _, rows in results for r in rows], out)
    rows = [r for _, unit_rows in sweeps.measure_sweep(sweep, measure, stop, partial)
            for r in unit_rows]
    print_table(rows, out)
    config = dict(sweep.config, engine=engine_description(device_type))
    def write():
        if args.csv:
            write_csv(args.csv, stamped(rows), BANDWIDTH_COLUMNS + STAMP_COLUMNS)
        if args.json:
            write_json(args.json, {'config': config, 'rows': rows, **stamp()})
    # both files or neither: a failure puts back what each held (removes what it made)
    replace_together([p for p in (args.csv, args.json) if p], write)
    return rows


def main(argv=None):
    """Run the script; return the exit status.

    0 when done; 1 when an output cannot be written (a disk that fills); 2
    for bad input; 128 + the signal (130 for Ctrl-C) when stopped by a signal.
    """
    return sweeps.sweep_main(argv, build_parser, run, 'bandwidth')


def start(launcher=None):
    """The program: ``python scripts/bandwidth.py`` (``launcher``: its path)."""
    common.start(main, launcher)


if __name__ == '__main__':
    start()

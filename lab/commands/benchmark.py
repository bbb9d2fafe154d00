"""Measure the package's training path against the text's loop, side by side, in one run.

Each measurement runs in a fresh process (MXNet reads its threading settings
when it is imported): the text's loop with MXNet's defaults ("book"), the
package's path with the engine settings ``train.py`` applies ("ours"), and
PyTorch's CPU edition of the same networks (the ``.[bench]`` extra), on the
same images, batch and learning rate, taking turns within each round
(lab/NOTES.md, "The lab's benchmark"). Bad input stops before measuring
with one line and status 2; Ctrl-C or SIGTERM stops with one line and status
130 or 143, writing nothing.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import lab
from lab.commands import common
from lab.commands import bench_workers
from lab.commands.bench_aims import (  # noqa: F401  (TARGETS: the aims, for the tests)
    TARGETS, detail_table, summarize, table, torch_missing)
from gluon_multigpu.errors import DataError, GluonMultiGPUError, flag
from gluon_multigpu.base import signals
from gluon_multigpu.base.machine import stamp
from gluon_multigpu.filesafety.files import write_json
from gluon_multigpu.filesafety.targets import check_outputs

# FULL: ResNet-18's 2 warm-up and 10 measured steps, the issue's short run of 2 epochs of 6
# batches; the small CNN's steps take a fortieth of ResNet-18's, so it runs 10 and 100 (cnn_*)
FULL = {'steps': 10, 'warmup': 2, 'cnn_steps': 100, 'cnn_warmup': 10,
        'gemm_n': 2048, 'gemm_reps': 5, 'pipeline_images': 60000,
        'eval_images': 512, 'memory_train': 7680, 'e2e_train': None, 'e2e_test': None,
        'batches': {'small': 32, 'target': 128, 'book': (256, 512), 'resnet_book': 512}}
QUICK = {'steps': 1, 'warmup': 1, 'cnn_steps': 1, 'cnn_warmup': 1,
         'gemm_n': 256, 'gemm_reps': 2, 'pipeline_images': 2048,
         'eval_images': 64, 'memory_train': 1024, 'e2e_train': 1024, 'e2e_test': 256,
         'batches': {'small': 8, 'target': 16, 'book': (12, 24), 'resnet_book': 24}}



def build_parser():
    """Return the argument parser of this script."""
    p = common.OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument('--data-dir', metavar='DIR',
                   default=os.path.expanduser('~/.mxnet/datasets/fashion-mnist'),
                   help='folder of the four Fashion-MNIST IDX .gz files '
                   '(default: ~/.mxnet/datasets/fashion-mnist)')
    p.add_argument('--repeats', type=common.int_in(1, 100), default=2, metavar='N',
                   help='rounds over all measurements; medians are reported (default: 2)')
    p.add_argument('--json', metavar='PATH', default='benchmark.json',
                   help='where to write every measurement (default: benchmark.json)')
    p.add_argument('--quick', action='store_true',
                   help='tiny sizes, to check that the benchmark runs (figures meaningless)')
    p.add_argument('--only', nargs='+', metavar='PREFIX',
                   help='run only the measurements whose key starts with a PREFIX '
                   '(e.g. train/resnet18 pytorch/resnet18 e2e); aims lacking a figure '
                   'show n/a')
    p.add_argument('--worker', metavar='SPEC', help=argparse.SUPPRESS)
    return p


def parse_args(argv=None):
    """Parse the command line (``sys.argv[1:]`` when ``argv`` is None)."""
    return build_parser().parse_args(argv)


def variant_env():
    """The environment of a measurement process: without this one's engine settings.

    The process applies ours itself for an "ours" variant (``worker``); "book" runs on MXNet's.
    """
    env = dict(os.environ)
    for name in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY', 'OPENBLAS_NUM_THREADS'):
        env.pop(name, None)  # the package decides, or MXNet does
    env.pop('GLUON_MULTIGPU_ENGINE_ENV', None)
    return lab.child_env(env)


def plan(size, data_dir, bfloat16=True):
    """Return the list of measurements: (key, spec) pairs, book and ours side by side;
    ``bfloat16``: with ResNet-18 in bfloat16, ours and PyTorch's, beside float32's."""
    tasks = []

    def add(key, kind, variant, **spec):
        tasks.append((key, dict(spec, kind=kind, variant=variant, data_dir=data_dir)))
    target, small = size['batches']['target'], size['batches']['small']

    def steps(model):
        if model == 'simple-cnn':
            return {'steps': size['cnn_steps'], 'warmup': size['cnn_warmup']}
        return {'steps': size['steps'], 'warmup': size['warmup']}

    def train(model, devices, variant, batch, kvstore='device', **dtype):
        add(f'train/{model}/{devices}/{kvstore}/{batch}/{variant}'
            + ''.join(f'/{d}' for d in dtype.values()), 'throughput', variant,
            model=model, devices=devices, kvstore=kvstore, batch=batch, **steps(model), **dtype)
    for model in ('resnet18', 'simple-cnn'):
        # the aims' four at the target batch, alternated within each round
        train(model, 2, 'book', target)
        train(model, 2, 'ours', target)
        add(f'pytorch/{model}/{target}', 'torch_throughput', 'pytorch', model=model,
            batch=target, **steps(model))
        train(model, 1, 'ours', target)
        if bfloat16 and model == 'resnet18':  # its converted graph, and PyTorch's autocast
            train(model, 2, 'ours', target, dtype='bfloat16')
            add(f'pytorch/{model}/{target}/bfloat16', 'torch_throughput', 'pytorch',
                model=model, batch=target, dtype='bfloat16', **steps(model))
        for variant in ('book', 'ours'):
            train(model, 2, variant, small)
        train(model, 2, 'ours', target, kvstore='local')
    train('resnet18', 2, 'ours', size['batches']['resnet_book'])  # the book's: as fast?
    # the book's own batch sizes: 256 on one device, 512 on two (the simple CNN: cheap)
    for devices, batch in zip((1, 2), size['batches']['book']):
        for variant in ('book', 'ours'):
            train('simple-cnn', devices, variant, batch)
    for devices in (1, 2):
        add(f'gemm/{devices}', 'gemm', 'ours', devices=devices, n=size['gemm_n'],
            reps=size['gemm_reps'])
    if bfloat16:  # the CPU's bfloat16 matrix-multiply rate, as PyTorch reaches it
        add('gemm/bfloat16', 'torch_gemm', 'pytorch', n=size['gemm_n'], reps=size['gemm_reps'])
    for variant in ('book', 'ours'):
        add(f'pipeline/{variant}', 'pipeline', variant, images=size['pipeline_images'],
            batch=256)
        add(f'eval/resnet18/2/{variant}', 'evaluation', variant, devices=2,
            images=size['eval_images'], batch=target)
        add(f'memory/{variant}', 'memory', variant, devices=2, batch=256, epochs=3,
            num_train=size['memory_train'], num_test=256)
        add(f'e2e/{variant}', 'end_to_end', variant, devices=2, batch=512, epochs=2,
            num_train=size['e2e_train'], num_test=size['e2e_test'])
    return tasks


def run_task(spec):
    """Run one measurement in a fresh process; return its result dict."""
    env = variant_env()
    try:  # the short run's clock starts as the process is launched (bench_workers.launched_at)
        proc = subprocess.run([sys.executable, '-m', 'lab.commands.benchmark', '--worker',
                               json.dumps(dict(spec, launched=time.time()))],
                              capture_output=True, text=True, env=env, timeout=900,
                              preexec_fn=signals.dying_with_parent())
    except subprocess.TimeoutExpired:
        return {'error': 'took more than 900 s'}
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[len('RESULT '):])
    tail = (proc.stderr.strip().splitlines() or ['no output'])[-1]
    return {'error': f'exit {proc.returncode}: {tail}'}


def main(argv=None):
    """Run every measurement, print the tables, write the JSON; return the exit status.

    0 when done; 1 when the JSON cannot be written; 2 for bad input; 130 or
    143 when stopped by SIGINT or SIGTERM.
    """
    args = parse_args(argv)
    if args.worker:
        return worker(args.worker)
    return common.stopping_main(argv, build_parser, run)


def worker(text):
    """A measurement process: run the measurement ``text`` (JSON) describes, print its result."""
    try:
        spec = json.loads(text)
        kind, ours = bench_workers.WORKERS[spec['kind']], spec['variant'] == 'ours'
    except (ValueError, KeyError, TypeError):
        print('error: --worker is how benchmark.py starts its measurement processes; leave it '
              'out', file=sys.stderr)
        return 2
    if ours:  # the settings train.py applies for this device count
        common.apply_engine_settings(spec.get('devices'))
    print('RESULT ' + json.dumps(kind(spec)), flush=True)
    return 0


def run(args, out=None):
    """Check the input, run every measurement, print the tables, write the JSON."""
    out = out or sys.stdout
    missing = [f for f in ('train-images-idx3-ubyte.gz', 't10k-images-idx3-ubyte.gz')
               if not os.path.isfile(os.path.join(args.data_dir, f))]
    if missing:
        raise DataError(f'{args.data_dir} lacks {", ".join(missing)}; point `data_dir` at '
                           'the Fashion-MNIST files')
    from gluon_multigpu.section.data import input_files  # pylint: disable=import-outside-toplevel
    check_outputs(files=[('--json', args.json)], inputs=input_files('fashion-mnist', args.data_dir))
    size = QUICK if args.quick else FULL
    no_bfloat16 = bfloat16_missing()
    tasks = plan(size, os.path.abspath(args.data_dir), bfloat16=not no_bfloat16)
    if args.only:
        tasks = [(k, s) for k, s in tasks if any(k.startswith(p) for p in args.only)]
        if not tasks:
            raise GluonMultiGPUError(f'no measurement matches --only {" ".join(args.only)}')
    results = {key: [] for key, _ in tasks}
    start = time.perf_counter()
    for round_ in range(args.repeats):
        # Every other round backwards: no measurement always follows the same one.
        for i, (key, spec) in enumerate(tasks if round_ % 2 == 0 else tasks[::-1], 1):
            if round_ and key.startswith('e2e/'):
                continue  # two whole epochs each: measured once, to stay within 10 minutes
            tic = time.perf_counter()
            result = run_task(spec)
            results[key].append(result)
            shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()
                     if not isinstance(v, list)}
            print(f'[round {round_ + 1}/{args.repeats}, {i}/{len(tasks)}] {key}: {shown} '
                  f'({time.perf_counter() - tic:.0f} s)', file=sys.stderr, flush=True)
    flops = flops_per_image()
    rows = summarize(results, flops, size['batches']['target'], size['batches']['resnet_book'])
    no_torch = torch_missing(results)
    no_bf16 = f'\nThe bfloat16 rows are n/a: {no_bfloat16}' if no_bfloat16 else ''
    print(table(rows, no_torch) + no_bf16, f"\nTraining speeds at batch "
          f"{size['batches']['target']}: the short run is every step's images over the "
          f"process's whole time, from its launch (importing, reading the images, building: a "
          f"user's run), the steady state the steps after the warm-up (ResNet-18: "
          f"{size['steps']} after {size['warmup']}, the small CNN: {size['cnn_steps']} after "
          f"{size['cnn_warmup']}); medians of {args.repeats} round(s), every other round "
          'backwards; beside a ratio of two measurements, the 95% interval of its paired ratios '
          f'(from {args.repeats} rounds), "inside the noise" where the aim\'s threshold falls '
          'within it. bfloat16: the package\'s --dtype bfloat16 against PyTorch eager under '
          "torch.autocast('cpu', dtype=torch.bfloat16), the same steps. "
          'Memory: peak resident MiB of the whole process.\n', detail_table(results),
          file=out, sep='\n')
    print(f'\nResNet-18: {flops / 1e9:.2f} GFLOP per training image (forward + backward, '
          f'from layer shapes); {time.perf_counter() - start:.0f} s in all; '
          f'{os.cpu_count()} CPUs', file=out)
    write_json(args.json, {'targets': rows, 'measurements': results,
                           'flops_per_image': flops, 'quick': args.quick,
                           'repeats': args.repeats, 'cpus': os.cpu_count(),
                           'target_batch': size['batches']['target'],
                           'pytorch_missing': no_torch, 'bfloat16_missing': no_bfloat16,
                           **stamp()})
    return rows


def bfloat16_missing():
    """Why this CPU trains no bfloat16 (``precision.check_bfloat16``'s line), or None."""
    from gluon_multigpu.features import precision  # pylint: disable=import-outside-toplevel
    try:
        precision.check_bfloat16()
    except GluonMultiGPUError as e:
        return e.describe(flag)
    return None


def flops_per_image():
    """ResNet-18's training FLOPs per 28x28 image (imports MXNet in this process: done last)."""
    from gluon_multigpu.section.book import resnet18  # pylint: disable=import-outside-toplevel
    from gluon_multigpu.section.model import count_flops  # pylint: disable=import-outside-toplevel
    net = resnet18(10)
    net.initialize()
    return count_flops(net)


def start(launcher=None):
    """The program: ``python scripts/benchmark.py`` (``launcher``: its path).

    The parent loads MXNet too (for its checks): Ctrl-C or SIGTERM meanwhile
    is one line. A measurement process (``--worker``) starts from
    ``variant_env``, without these settings.
    """
    common.start(main, launcher, engine='--worker' not in sys.argv[1:], engine_argv=[])


if __name__ == '__main__':
    start()

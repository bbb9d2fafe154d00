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
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import lab
from gluon_multigpu.cli import common
from lab.commands import bench_workers
from gluon_multigpu.errors import DataError, GluonMultiGPUError
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

TARGETS = [  # key, what, comparison, threshold
    ('resnet_vs_pytorch_short', 'ResNet-18 short run (start-up included) images/s, ours '
     '(2 contexts) / PyTorch CPU', '>=', 1.1),
    ('resnet_vs_pytorch', 'ResNet-18 steady-state images/s, ours (2 contexts) / PyTorch CPU',
     '>=', 1.2),
    ('resnet_speedup', 'ResNet-18 steady-state images/s, ours / book (2 contexts)', '>=', 1.8),
    ('book_batch', 'ResNet-18 steady-state images/s, ours (2 contexts): the book\'s batch 512 '
     '(256 a context) / batch 128', '>=', 1.0),
    ('two_vs_one', 'ResNet-18 steady-state images/s, ours: 2 contexts / 1 context (same global '
     'batch)', '>=', 0.95),
    ('flop_efficiency', 'ResNet-18 achieved GFLOP/s (ours, 2 contexts) / measured '
     'matrix-multiply GFLOP/s', '>=', 0.85),
    ('cnn_vs_pytorch_short', 'small CNN short run (start-up included) images/s, ours '
     '(2 contexts) / PyTorch CPU', '>=', 1.0),
    ('cnn_vs_pytorch', 'small CNN steady-state images/s, ours (2 contexts) / PyTorch CPU',
     '>=', 1.0),
    ('resnet_memory', 'ResNet-18 peak MiB, ours (2 contexts) / PyTorch CPU', '<=', 1.2),
    ('cnn_memory', 'small CNN peak MiB, ours (2 contexts) / PyTorch CPU', '<=', 1.2),
    ('pipeline', 'data pipeline images/s, ours / book-style DataLoader', '>=', 20.0),
    ('e2e_time', 'end to end (simple CNN, 2 epochs, real data): epoch wall time, ours / book',
     '<=', 0.5),
    ('e2e_accuracy', 'end to end: |test acc ours - book| (points)', '<=', 1.0),
    ('memory_growth', 'ours: resident memory growth, epoch 1 to epoch 3', '<=', 0.05),
]
#: The training-speed aims are at this batch, on 2 contexts (QUICK uses its own)
TARGET_BATCH = FULL['batches']['target']
#: The book's batch for ResNet-18 (256 a device on two devices): measured beside the target's
BOOK_BATCH = FULL['batches']['resnet_book']
INSTALL_TORCH = "pip install -e '.[bench]'"


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


def plan(size, data_dir):
    """Return the list of measurements: (key, spec) pairs, book and ours side by side."""
    tasks = []

    def add(key, kind, variant, **spec):
        tasks.append((key, dict(spec, kind=kind, variant=variant, data_dir=data_dir)))
    target, small = size['batches']['target'], size['batches']['small']

    def steps(model):
        if model == 'simple-cnn':
            return {'steps': size['cnn_steps'], 'warmup': size['cnn_warmup']}
        return {'steps': size['steps'], 'warmup': size['warmup']}

    def train(model, devices, variant, batch, kvstore='device'):
        add(f'train/{model}/{devices}/{kvstore}/{batch}/{variant}', 'throughput', variant,
            model=model, devices=devices, kvstore=kvstore, batch=batch, **steps(model))
    for model in ('resnet18', 'simple-cnn'):
        # the aims' four at the target batch, alternated within each round
        train(model, 2, 'book', target)
        train(model, 2, 'ours', target)
        add(f'pytorch/{model}/{target}', 'torch_throughput', 'pytorch', model=model,
            batch=target, **steps(model))
        train(model, 1, 'ours', target)
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


def median_of(runs, field):
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values else None


def _ratio(a, b):
    return a / b if a is not None and b else None


class _Medians:
    """The medians of the measurements ``results`` that the aims compare, by what they measure."""

    def __init__(self, results, target_batch):
        self.results, self.batch = results, target_batch

    def __call__(self, key, field='images_per_sec'):
        return median_of(self.results.get(key, []), field)

    def ours(self, model, devices=2, field='images_per_sec'):
        return self(f'train/{model}/{devices}/device/{self.batch}/ours', field)

    def pytorch(self, model, field='images_per_sec'):
        return self(f'pytorch/{model}/{self.batch}', field)

    def versus_torch(self, model, field):
        return (self.pytorch(model, field), self.ours(model, field=field),
                _ratio(self.ours(model, field=field), self.pytorch(model, field)))

    def memory(self, model):
        """PyTorch's peak, ours, their ratio (MiB, the same run)."""
        peak, ours = self.pytorch(model, 'peak_mb'), self.ours(model, field='peak_mb')
        return peak, ours, _ratio(ours, peak)

    def end_to_end(self):
        """The figures of the end-to-end runs: ``e2e_time`` and ``e2e_accuracy``."""
        e2e_ours = [r for r in self.results.get('e2e/ours', []) if 'epoch_seconds' in r]
        e2e_book = [r for r in self.results.get('e2e/book', []) if 'epoch_seconds' in r]

        def e2e_time(rs):
            return statistics.median(statistics.mean(r['epoch_seconds']) for r in rs) \
                if rs else None
        acc_gap = (abs(statistics.median(r['test_acc'] for r in e2e_ours)
                       - statistics.median(r['test_acc'] for r in e2e_book)) * 100
                   if e2e_ours and e2e_book else None)
        return {'e2e_time': (e2e_time(e2e_book), e2e_time(e2e_ours),
                             _ratio(e2e_time(e2e_ours), e2e_time(e2e_book))),
                'e2e_accuracy': (median_of(e2e_book, 'test_acc'),
                                 median_of(e2e_ours, 'test_acc'), acc_gap)}


def figures(results, flops_per_image, target_batch=TARGET_BATCH, book_batch=BOOK_BATCH):
    """The aims' figures from the medians: key -> (reference, ours, measured)."""
    med = _Medians(results, target_batch)
    resnet, book = med.ours('resnet18'), med(f'train/resnet18/2/device/{target_batch}/book')
    gemm = max(filter(None, (med('gemm/1', 'gflops'), med('gemm/2', 'gflops'))), default=None)
    achieved = resnet * flops_per_image / 1e9 if resnet else None
    return {
        'resnet_vs_pytorch_short': med.versus_torch('resnet18', 'short_images_per_sec'),
        'resnet_vs_pytorch': med.versus_torch('resnet18', 'images_per_sec'),
        'resnet_speedup': (book, resnet, _ratio(resnet, book)),
        'book_batch': (resnet, med(f'train/resnet18/2/device/{book_batch}/ours'),
                       _ratio(med(f'train/resnet18/2/device/{book_batch}/ours'), resnet)),
        'two_vs_one': (med.ours('resnet18', 1), resnet, _ratio(resnet, med.ours('resnet18', 1))),
        'flop_efficiency': (gemm, achieved, _ratio(achieved, gemm)),
        'cnn_vs_pytorch_short': med.versus_torch('simple-cnn', 'short_images_per_sec'),
        'cnn_vs_pytorch': med.versus_torch('simple-cnn', 'images_per_sec'),
        'resnet_memory': med.memory('resnet18'),
        'cnn_memory': med.memory('simple-cnn'),
        'pipeline': (med('pipeline/book'), med('pipeline/ours'),
                     _ratio(med('pipeline/ours'), med('pipeline/book'))),
        **med.end_to_end(),
        'memory_growth': (med('memory/book', 'growth'), med('memory/ours', 'growth'),
                          med('memory/ours', 'growth')),
    }


def paired_ratios(results, target_batch=TARGET_BATCH, book_batch=BOOK_BATCH):
    """key -> ``paired.Ratio`` of the aims comparing two measurements, round ``i`` with round
    ``i`` (the ``i``-th results), where both have the figure (none for e2e: made once)."""
    from gluon_multigpu.study.paired import ratio_of  # pylint: disable=import-outside-toplevel
    ours, cnn, torch, torch_cnn = (f'train/resnet18/2/device/{target_batch}/ours',
                                   f'train/simple-cnn/2/device/{target_batch}/ours',
                                   f'pytorch/resnet18/{target_batch}',
                                   f'pytorch/simple-cnn/{target_batch}')
    steady, short, peak = 'images_per_sec', 'short_images_per_sec', 'peak_mb'
    found = {}
    for key, num, den, field in (
            ('resnet_vs_pytorch_short', ours, torch, short),
            ('resnet_vs_pytorch', ours, torch, steady),
            ('resnet_speedup', ours, f'train/resnet18/2/device/{target_batch}/book', steady),
            ('book_batch', f'train/resnet18/2/device/{book_batch}/ours', ours, steady),
            ('two_vs_one', ours, f'train/resnet18/1/device/{target_batch}/ours', steady),
            ('cnn_vs_pytorch_short', cnn, torch_cnn, short),
            ('cnn_vs_pytorch', cnn, torch_cnn, steady), ('resnet_memory', ours, torch, peak),
            ('cnn_memory', cnn, torch_cnn, peak),
            ('pipeline', 'pipeline/ours', 'pipeline/book', steady)):
        both = [(a[field], b[field]) for a, b in zip(results.get(num, []), results.get(den, []))
                if a.get(field) and b.get(field)]
        found[key] = ratio_of(*zip(*both)) if both else None
    return found


def summarize(results, flops_per_image, target_batch=TARGET_BATCH, book_batch=BOOK_BATCH):
    """Compute the aims' figures from the medians (``figures``); return a list of row dicts.

    ``results``: measurement key -> list of result dicts (one a round);
    ``target_batch``: the global batch of the training-speed aims. ``low``/``high``:
    the 95% interval of an aim's paired ratio (``paired_ratios``), ``sure``:
    whether the aim's threshold is outside it (None without an interval).
    """
    found = figures(results, flops_per_image, target_batch, book_batch)
    intervals = paired_ratios(results, target_batch, book_batch)
    rows = []
    for key, what, op, threshold in TARGETS:
        base, value, measured = found[key]
        met = None if measured is None else (measured >= threshold if op == '>=' else
                                             measured <= threshold)
        ratio = intervals.get(key)
        low, high = (ratio.low, ratio.high) if ratio is not None else (None, None)
        sure = None if low is None else not low <= threshold <= high
        rows.append({'key': key, 'what': what, 'reference': base, 'ours': value,
                     'measured': measured, 'target': f'{op} {threshold:g}', 'met': met,
                     'low': low, 'high': high, 'sure': sure})
    return rows


def torch_missing(results):
    """Whether PyTorch is missing: no ``torch`` to import, or a measurement found none."""
    return (importlib.util.find_spec('torch') is None
            or any(r.get('torch_missing') for runs in results.values() for r in runs))


def fmt(x, digits=3):
    if x is None:
        return 'n/a'
    return f'{x:.{digits}g}' if abs(x) < 1000 else f'{x:,.0f}'


def table(rows, no_torch=False):
    """Return the Markdown table of the aims; ``no_torch``: a line under it says how to add
    PyTorch, whose rows are n/a."""
    lines = ['| aim | reference | ours | measured | aim | met |',
             '| --- | ---: | ---: | ---: | :---: | :---: |']
    for r in rows:
        met = 'n/a' if r['met'] is None else ('yes' if r['met'] else 'NO')
        if r.get('sure') is False:
            met += ' (inside the noise)'
        measured = fmt(r['measured'])
        if r.get('low') is not None:
            measured += f" ({fmt(r['low'])}-{fmt(r['high'])})"
        lines.append(f"| {r['what']} | {fmt(r['reference'])} | {fmt(r['ours'])} | "
                     f"{measured} | {r['target']} | {met} |")
    if no_torch:
        lines.append(f'\nPyTorch is not installed, so the rows against it are n/a: install it '
                     f'with {INSTALL_TORCH}')
    return '\n'.join(lines)


def detail_table(results):
    """Return the Markdown table of every measurement's median."""
    lines = ['| measurement | median | runs |', '| --- | ---: | ---: |']
    for key, runs in results.items():
        fields = [f for f in ('images_per_sec', 'short_images_per_sec', 'startup_s', 'gflops',
                              'growth', 'peak_mb', 'test_acc')
                  if median_of(runs, f) is not None]
        if key.startswith('e2e/'):
            value = ', '.join(f"{statistics.mean(r['epoch_seconds']):.1f} s/epoch, acc "
                              f"{r['test_acc']:.3f}" for r in runs if 'epoch_seconds' in r)
        else:
            value = ', '.join(f'{f} {fmt(median_of(runs, f))}' for f in fields)
        errors = [r['error'] for r in runs if 'error' in r]
        lines.append(f"| {key} | {value or errors[0] if errors else value} | {len(runs)} |")
    return '\n'.join(lines)


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
    tasks = plan(size, os.path.abspath(args.data_dir))
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
    print(table(rows, no_torch), f"\nTraining speeds at batch {size['batches']['target']}: the "
          f"short run is every step's images over the process's whole time, from its launch "
          f"(importing, reading the images, building: a user's run), the steady state the steps "
          f"after the warm-up (ResNet-18: {size['steps']} after {size['warmup']}, the small CNN: "
          f"{size['cnn_steps']} after {size['cnn_warmup']}); medians of {args.repeats} "
          f"round(s), every other round "
          'backwards; beside a ratio of two measurements, the 95% interval of its paired ratios '
          '(from 2 rounds), "inside the noise" where the aim\'s threshold falls within it. '
          'Memory: peak resident MiB of the whole process.\n', detail_table(results),
          file=out, sep='\n')
    print(f'\nResNet-18: {flops / 1e9:.2f} GFLOP per training image (forward + backward, '
          f'from layer shapes); {time.perf_counter() - start:.0f} s in all; '
          f'{os.cpu_count()} CPUs', file=out)
    write_json(args.json, {'targets': rows, 'measurements': results,
                           'flops_per_image': flops, 'quick': args.quick,
                           'repeats': args.repeats, 'cpus': os.cpu_count(),
                           'target_batch': size['batches']['target'],
                           'pytorch_missing': no_torch, **stamp()})
    return rows


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

"""Measure training in bfloat16 against float32 on one CPU context: the evidence behind --dtype.

MXNet 1.9.1 can train the package's networks in bfloat16 in NumPy mode only
one way: compile the network, convert its graph with ``amp.convert_symbol``
(casts to bfloat16 before the convolutions and dense layers, float32 master
weights and gradients) and wrap the result as a NumPy-mode ``SymbolBlock``
that shares the float32 parameters. (``amp.init`` leaves ``mxnet.np``
operators alone, ``amp.convert_hybrid_block`` returns a block whose outputs
NumPy mode refuses, and ``net.cast('bfloat16')`` fails.) This script trains
the same steps three ways, taken in turn, round after round, and prints the
images/s of each and the ratio to float32: float32; bfloat16 with AMP's own
operator lists (BatchNorm, ReLU and additions on bfloat16 data too); and
bfloat16 in the convolutions and dense layers only.
"""
import statistics
import sys
import time

# What loads MXNet (or matplotlib) is imported where it is first used: after the engine settings.
from lab.commands import common
from lab.commands import sweeps
from lab.commands.common import int_in
from gluon_multigpu.base.machine import stamp
from gluon_multigpu.filesafety import files
from lab.studies import sweep as sweep_module
from gluon_multigpu.filesafety.targets import check_outputs

#: model -> (batch, steps per round): about a second per round on two cores.
SETTINGS = {'simple-cnn': (128, 10), 'resnet18': (64, 2)}
#: What is measured: float32, AMP's bfloat16, bfloat16 in convolutions and dense layers only
#: (``precision.CONV_ONLY_FP32`` kept in float32).
VARIANTS = ('float32', 'bfloat16', 'bfloat16 conv/dense only')


def build_parser():
    """Return the argument parser of this script."""
    p = common.OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument('--models', nargs='+', choices=list(SETTINGS), default=list(SETTINGS),
                   help='networks to measure (default: both)')
    p.add_argument('--rounds', type=int_in(1, 100), default=5, metavar='N',
                   help='rounds; medians are reported (default: 5)')
    p.add_argument('--steps', type=int_in(1, 1000), metavar='N',
                   help='training steps per variant and round (default: 10 simple-cnn, '
                   '2 resnet18)')
    common.add_data_flags(p, 'its test images feed the steps (without --data-dir or '
                          '--download the steps use random images of its shape; --download alone '
                          'uses ~/.mxnet/datasets/fashion-mnist)', default=False)
    p.add_argument('--json', metavar='FILE',
                   help="also write the table's figures (medians, ratios), with this machine "
                   'and the date, to FILE')
    common.add_sweep_flags(p, RESULTS)
    return p


#: Where the rounds are kept as they are measured, unless --results says otherwise.
RESULTS = 'bfloat16-results.json'


def batch_of(args, batch):
    """One batch of Fashion-MNIST (or random images of its shape) on the CPU."""
    from mxnet import np  # pylint: disable=import-outside-toplevel
    from gluon_multigpu.section.data import read_split, synthetic_data  # pylint: disable=import-outside-toplevel
    if args.data_dir or args.download:
        images, labels = read_split(sweeps.data_root(args), 'test', 'fashion-mnist')
        return (np.array(images[:batch, None] / 255.0, dtype='float32'),
                np.array(labels[:batch], dtype='int32'))
    data, _ = synthetic_data('fashion-mnist', batch, num_train=batch, num_test=batch)
    return next(iter(data))


def steps_of(model, variant, X, y):
    """A function that runs one SGD step of ``model`` in ``variant``; fresh weights, seed 0."""
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    from mxnet import autograd, gluon  # pylint: disable=import-outside-toplevel
    from gluon_multigpu.section.model import default_initializer, get_model  # pylint: disable=import-outside-toplevel
    mx.random.seed(0)
    # the package's conversion (--dtype bfloat16's), on the first step
    from gluon_multigpu.features.precision import Bfloat16, _as_hybrid  # pylint: disable=import-outside-toplevel
    net = _as_hybrid(get_model(model))
    net.initialize(default_initializer(model), ctx=mx.cpu())
    if variant == 'float32':
        net.hybridize(static_alloc=True)
        block = net
    else:
        block = Bfloat16(net, conv_only=variant != 'bfloat16')
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01})
    loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            l = loss(block(X), y)
        l.backward()
        trainer.step(X.shape[0])
        return l
    return step


def warm_steps(args, model, stop):
    """The three variants' step functions for ``model``, each warmed up by 3 steps."""
    from mxnet import npx  # pylint: disable=import-outside-toplevel
    from lab.studies.measure import check_stop  # pylint: disable=import-outside-toplevel
    batch, _ = SETTINGS[model]
    X, y = batch_of(args, batch)
    runs = {v: steps_of(model, v, X, y) for v in VARIANTS}
    for step in runs.values():
        for _ in range(3):
            check_stop(stop)
            step()
    npx.waitall()
    return runs


def measure_round(runs, batch, steps, stop=None, backwards=False):
    """Images/s of each variant in one round of ``steps`` steps, taken in turn (``backwards``:
    in the reverse order, as every other round is, so that none always follows the same)."""
    from mxnet import npx  # pylint: disable=import-outside-toplevel
    from lab.studies.measure import check_stop  # pylint: disable=import-outside-toplevel
    speeds = {}
    for variant, step in (list(runs.items())[::-1] if backwards else runs.items()):
        tic = time.perf_counter()
        for _ in range(steps):
            check_stop(stop)
            step()
        npx.waitall()  # Sync point: the devices' time, not Python's
        speeds[variant] = batch * steps / (time.perf_counter() - tic)
    return speeds


def make_sweep(args, say):
    """One unit per (model, round), kept in --results."""
    from lab.studies.measure import MODEL_COST  # pylint: disable=import-outside-toplevel
    units = []
    for model in args.models:
        batch, steps = SETTINGS[model]
        steps = args.steps or steps
        units += [sweep_module.Unit(f'{model}/{r + 1}', f'{model}, round {r + 1}/{args.rounds}: '
                                    f'{steps} steps of {batch} in each of {len(VARIANTS)} '
                                    'variants', MODEL_COST[model] * batch * steps)
                  for r in range(args.rounds)]
    config = {'models': args.models, 'rounds': args.rounds, 'steps': args.steps,
              'data': 'fashion-mnist' if args.data_dir or args.download else 'synthetic'}
    options = [o for o, wanted in (('--rounds 1', args.rounds > 1),
                                   ('--models simple-cnn', 'resnet18' in args.models))
               if wanted]
    return sweep_module.Sweep(args.results or RESULTS, 'bfloat16', config, units, say,
                              resume=args.resume, overwrite=args.overwrite,
                              check=lambda unit, speeds: isinstance(speeds, dict) and all(
                                  sweep_module.numbers_ok([speeds.get(v)]) and speeds[v] > 0
                                  for v in VARIANTS),
                              advice=', '.join(options))


def medians(results):
    """Per model and variant of the rounds measured: ``model``, ``batch``, ``compute``, the
    median ``images_per_s``, and its paired ratio to float32's in the same rounds
    (``vs_float32``, with ``vs_float32_low``/``high``, its 95% interval, and ``verdict``:
    faster or slower only when the interval excludes 1, ``study.paired``)."""
    from gluon_multigpu.study.paired import Paired  # pylint: disable=import-outside-toplevel
    from lab.studies.verdicts import versus  # pylint: disable=import-outside-toplevel
    rows = []
    for model in dict.fromkeys(u.key.split('/')[0] for u, _ in results):
        rounds = [(int(u.key.split('/')[1]), r) for u, r in results
                  if u.key.split('/')[0] == model]
        pairs = Paired(VARIANTS, higher_is_better=True, warmup=0)  # every round is warmed
        for n, r in rounds:
            for v in VARIANTS:
                pairs.add(v, n, r[v])
        for variant in VARIANTS:
            against = versus(pairs, variant, 'float32')
            rows.append({'model': model, 'batch': SETTINGS[model][0], 'compute': variant,
                         'images_per_s': statistics.median(r[variant] for _, r in rounds),
                         'vs_float32': against['ratio'], 'vs_float32_low': against['low'],
                         'vs_float32_high': against['high'], 'verdict': against['verdict'],
                         'rounds': against['rounds']})
    return rows


def table(results):
    """The Markdown table of the rounds measured: medians, and the paired ratio to float32."""
    from gluon_multigpu.study.kvstore_report import markdown_table  # pylint: disable=import-outside-toplevel
    rows = [[r['model'], r['batch'], r['compute'], f"{r['images_per_s']:.1f}",
             f"{r['vs_float32']:.2f}" + (f" ({r['vs_float32_low']:.2f}-{r['vs_float32_high']:.2f})"
                                         if r['vs_float32_low'] is not None
                                         and r['compute'] != 'float32' else ''),
             r['verdict'] or '-'] for r in medians(results)]
    return rows, markdown_table(
        ['model', 'batch', 'compute', 'images/s', 'vs float32 (95% interval)', 'verdict'], rows,
        'lrlrrl')


def answers(rows):
    """One line per model and bfloat16 variant: its paired ratio to float32 and the verdict."""
    from lab.studies.verdicts import describe_versus  # pylint: disable=import-outside-toplevel
    return [f"{r['model']}, {r['compute']}: " + describe_versus(
        {'ratio': r['vs_float32'], 'low': r['vs_float32_low'], 'high': r['vs_float32_high'],
         'verdict': r['verdict'], 'rounds': r['rounds']}, 'float32')
        for r in rows if r['compute'] != 'float32']


def run(args, out=None, stop=None):
    """Measure every model, each round kept in --results; print one table and the answers."""
    from gluon_multigpu.features import precision  # pylint: disable=import-outside-toplevel
    precision.check_bfloat16()  # no bfloat16 kernels: one line naming what the CPU lacks, status 2
    out = out or sys.stdout
    check_outputs(files=[('--results', args.results or RESULTS), ('--json', args.json)])
    if args.data_dir or args.download:
        sweeps.data_root(args)
    sweep = make_sweep(args, common.say_quietly)
    runs = {}

    def measure(unit):
        model, round_ = unit.key.split('/')
        batch, steps = SETTINGS[model]
        if model not in runs:
            runs.clear()  # one model's compiled graphs at a time
            runs[model] = warm_steps(args, model, stop)
        speeds = measure_round(runs[model], batch, args.steps or steps, stop,
                               backwards=int(round_) % 2 == 0)
        speeds = {v: speeds[v] for v in VARIANTS}  # in the table's order
        common.say_quietly(f'  {unit.label}: ' + ', '.join(f'{v} {s:.1f}'
                                                          for v, s in speeds.items())
                           + ' images/s')
        return speeds

    def partial(results):
        print(sweeps.partial_heading(sweep), file=out)
        print(table(results)[1], file=out, flush=True)
    results = sweeps.measure_sweep(sweep, measure, stop, partial)
    rows, text = table(results)
    print(text, file=out)
    print('', *answers(medians(results)), file=out, sep='\n')
    if args.json:
        files.write_json(args.json, {'rounds': args.rounds, 'rows': medians(results),
                                     **stamp()})
    return rows


def main(argv=None):
    """Run the script; return the exit status.

    0 when done; 2 for bad input (a CPU without bfloat16 kernels); 128 + the
    signal (130 for Ctrl-C) when stopped by a signal.
    """
    return sweeps.sweep_main(argv, build_parser, run, 'bfloat16')


def start(launcher=None):
    """The program: ``python scripts/bfloat16.py`` (``launcher``: its path)."""
    common.start(main, launcher, engine_argv=['--cpu-devices', '1'])  # one context, every core


if __name__ == '__main__':
    start()

"""Where ResNet-18's memory goes on CPU contexts: each engine lever's peak memory and speed.

A maintainer's tool, not part of the package. ResNet-18 (and the small CNN)
at batch 128 on two CPU contexts (64 images a context), the package's training step
(``steps.train_epoch``) on the first Fashion-MNIST test images, each
configuration in a fresh process (MXNet reads its settings as it loads),
the configurations alternated within each round, medians over the rounds.
Each row changes one lever from the package's settings (the first row);
the last rows are the previous settings and the book's device list as MXNet
leaves it, and one context with MXNet's own OpenMP threads (the cost that
``engine``'s warning names); the small CNN's rows show what the allocator's
settings cost a network of fast steps.

    python tools/levers.py --data-dir ../shared/data/fashion-mnist   # writes docs/results/levers.json

Speeds are comparable only within one run (the same machine, side by side).
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402

#: name -> (what changes from the package's settings, the configuration)
LEVERS = {
    'package': ('the package: a thread per context, 1 scratch copy each, static_alloc '
                "(ResNet-18's recipe), freed blocks of 4 MiB or more returned", {}),
    'per_block': ('each block below the containers compiled as a graph of its own (ResNet-18 '
                  'before it was built with HybridSequential containers)', {'per_block': True}),
    'before_43': ("without static_alloc, MXNet's 4 scratch copies (the package before issue 43)",
                  {'static_alloc': False, 'copies': '4'}),
    'glibc_default': ("glibc's own allocator behaviour (freed blocks kept in its heap)",
                      {'malloc': False}),
    'threshold_1m': ('freed blocks of 1 MiB or more returned', {'threshold': 1 << 20}),
    'static_alloc': ('networks compiled with static_alloc', {'static_alloc': True}),
    'one_copy': ('1 scratch copy per thread', {'copies': '1'}),
    'static_one_copy': ('static_alloc with 1 scratch copy per thread',
                        {'static_alloc': True, 'copies': '1'}),
    'one_thread': ("one thread queues both contexts, MXNet's 4 copies (the book's device list "
                   'before this change)', {'pushers': False}),
    'previous': ('one thread, 128 copies, static_alloc, glibc default (the settings before)',
                 {'pushers': False, 'copies': '128', 'static_alloc': True, 'malloc': False}),
    'one_context': ('one context, OpenMP on every core (the plan for one context)',
                    {'devices': 1}),
    'one_context_half': ("one context, MXNet's own OpenMP threads (half the cores)",
                         {'devices': 1, 'omp': None}),
    'cnn_package': ('the small CNN, the package', {'model': 'simple-cnn'}),
    'cnn_static_alloc': ('the small CNN compiled with static_alloc',
                         {'model': 'simple-cnn', 'static_alloc': True}),
    'cnn_one_copy': ('the small CNN, 1 scratch copy per thread',
                     {'model': 'simple-cnn', 'copies': '1'}),
    'cnn_one_graph': ('the small CNN compiled as one graph (under a HybridSequential)',
                      {'model': 'simple-cnn', 'one_graph': True}),
    'cnn_one_thread': ('the small CNN, one thread queues both contexts',
                       {'model': 'simple-cnn', 'pushers': False}),
    'cnn_glibc_default': ("the small CNN, glibc's own allocator behaviour",
                          {'model': 'simple-cnn', 'malloc': False}),
    'cnn_threshold_1m': ('the small CNN, freed blocks of 1 MiB or more returned',
                         {'model': 'simple-cnn', 'threshold': 1 << 20}),
    'cnn_previous': ('the small CNN, the settings before', {
        'model': 'simple-cnn', 'pushers': False, 'copies': '128', 'static_alloc': True,
        'malloc': False}),
}
#: Timed steps by model: the small CNN's step takes tens of milliseconds
TIMED = {'resnet18': 10, 'simple-cnn': 100}
BATCH, WARMUP = 128, 3


def worker(spec):
    """One measurement: configure as ``spec`` says, train, return the figures."""
    import resource
    from gluon_multigpu.base import engine
    if not spec.get('malloc', True):
        engine._STATE['malloc'] = False  # pylint: disable=protected-access  (decided: untouched)
    engine.MMAP_THRESHOLD = spec.get('threshold', engine.MMAP_THRESHOLD)
    model, steps = spec.get('model', 'resnet18'), TIMED[spec.get('model', 'resnet18')]
    devices_n = spec.get('devices', 2)
    os.environ.pop('OMP_NUM_THREADS', None)
    if spec.get('omp', 'plan') is None:  # MXNet's own: the user's "unset", kept as it is
        os.environ['GLUON_MULTIGPU_ENGINE_ENV'] = '0'
    if spec.get('copies'):
        os.environ['MXNET_CPU_TEMP_COPY'] = spec['copies']
    engine.configure(cpu_devices=devices_n)  # before anything below loads MXNet
    from lab.commands.bench_workers import _test_images
    from gluon_multigpu.section import steps as steps_mod
    from gluon_multigpu.section.data import ArrayLoader
    from gluon_multigpu.section.devices import cpu_devices
    from gluon_multigpu.section.kvstores import make_trainer
    from gluon_multigpu.section.model import default_initializer, get_model
    from gluon_multigpu.machinery.pushers import pushers_for
    if spec.get('omp', 'plan') is None:
        engine.return_freed_memory()  # the plan's allocator, MXNet's own threads
    from mxnet import gluon, npx
    devices = cpu_devices(devices_n)
    images, labels = _test_images(spec, BATCH * (WARMUP + steps))
    batches = list(ArrayLoader(images, labels, BATCH))
    net = get_model(model, 10)
    net.initialize(default_initializer(model), ctx=devices)
    if spec.get('one_graph'):
        from gluon_multigpu.features.precision import _as_hybrid
        net, recipe = _as_hybrid(net), net.recipe  # the same blocks, HybridSequential containers
        net.recipe = recipe
    if 'static_alloc' in spec:  # the lever, whatever the model's recipe says
        net.hybridize(static_alloc=spec['static_alloc'])
    elif spec.get('per_block'):
        _per_block(net, steps_mod.recipe_of(net).static_alloc)
        engine.freed_blocks_from(steps_mod.recipe_of(net).mmap_threshold)
    else:
        steps_mod.hybridize(net)
    trainer = make_trainer(net, 0.1, 'device')
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    use = pushers_for(devices) if spec.get('pushers', True) else contextlib.nullcontext()
    with use as pushers:
        steps_mod.train_epoch(steps_mod.Step(net, loss, trainer, devices, pushers=pushers),
                              batches[:WARMUP])
        npx.waitall()
        tic = time.perf_counter()
        steps_mod.train_epoch(steps_mod.Step(net, loss, trainer, devices, pushers=pushers,
                                             max_in_flight=1), batches[WARMUP:])
        npx.waitall()  # sync point: every timed step done
        seconds = time.perf_counter() - tic
    return {'images_per_sec': steps * BATCH / seconds,
            'peak_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            'settings': engine.settings(), 'malloc': engine.return_freed_memory()}


def _per_block(net, static_alloc):
    """Compile each block below ``net``'s containers as a graph of its own."""
    from mxnet.gluon import nn
    for child in net._children.values():  # pylint: disable=protected-access
        if isinstance(child, (nn.Sequential, nn.HybridSequential)):
            _per_block(child, static_alloc)
        else:
            child.hybridize(static_alloc=static_alloc)


def measure(name, data_dir):
    spec = dict(LEVERS[name][1], data_dir=data_dir)
    env = {k: v for k, v in os.environ.items()
           if k not in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY', 'GLUON_MULTIGPU_ENGINE_ENV')
           and not k.startswith('MALLOC_')}
    env['PYTHONPATH'] = ROOT
    proc = subprocess.run([sys.executable, __file__, '--worker', json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[7:])
    return {'error': (proc.stderr.strip().splitlines() or ['no output'])[-1]}


def kept_rows(path):
    """The rows of ``path`` still in ``LEVERS`` (each with its rounds), if it was measured on
    this machine today; otherwise a one-line error (a file's figures come from one machine)."""
    with open(path) as f:
        old = json.load(f)
    if (old.get('machine'), old.get('date')) != (stamp()['machine'], stamp()['date']):
        raise SystemExit(f"error: {path} was measured on {old.get('machine')} on "
                         f"{old.get('date')}; measure every lever again (without --update)")
    return {name: dict(row, rounds=row.get('rounds', old['rounds']))
            for name, row in old['levers'].items() if name in LEVERS}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--data-dir', default='../shared/data/fashion-mnist')
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--only', nargs='+', choices=sorted(LEVERS), help='these levers only')
    parser.add_argument('--out', default=os.path.join(ROOT, 'docs', 'results', 'levers.json'))
    parser.add_argument('--update', action='store_true', help="replace only the levers measured "
                        "in --out's rows (same machine and day), keep the others")
    parser.add_argument('--worker', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print('RESULT ' + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    names = args.only or list(LEVERS)
    runs = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:
            result = measure(name, args.data_dir)
            runs[name].append(result)
            print(f'[round {r + 1}/{args.rounds}] {name}: {result}', flush=True)
    rows = kept_rows(args.out) if args.update else {}
    for name in names:
        good = [x for x in runs[name] if 'error' not in x]
        rows[name] = {'what': LEVERS[name][0], 'runs': runs[name], 'rounds': args.rounds,
                      'images_per_sec': statistics.median(x['images_per_sec'] for x in good)
                      if good else None,
                      'peak_mib': statistics.median(x['peak_mib'] for x in good) if good else None}
    rows = {name: rows[name] for name in LEVERS if name in rows}  # the table's order
    result = dict(stamp(), batch=BATCH, warmup=WARMUP, steps=TIMED['resnet18'],
                  cnn_steps=TIMED['simple-cnn'],
                  rounds=min(row.get('rounds', args.rounds) for row in rows.values()),
                  levers=rows)
    with atomic_write(args.out) as f:
        f.write(json.dumps(result, indent=1) + '\n')
    for name, row in rows.items():
        print(f"{name:18} {row['images_per_sec'] or 0:7.1f} images/s {row['peak_mib'] or 0:8,.0f} "
              f"MiB  {row['what']}")
    return 0


if __name__ == '__main__':
    sys.exit(main())

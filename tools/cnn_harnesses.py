"""Why two measurements of the small CNN against PyTorch disagreed: both harnesses, side by side.

A maintainer's tool, not part of the package. Each round runs, in fresh
processes and alternated: the benchmark's training-speed measurement
(``lab.commands.bench_workers``: ours on two contexts and PyTorch, batch
128, 100 steps after 10, and 10 after 2 as it measured before) and the
other harness, a user's script (2 epochs of 60 synthetic batches of 128
through ``gm.train`` on two contexts, and the same layers in a PyTorch eager
loop, one test batch evaluated an epoch).
From each process it keeps the times from its launch: imports and images
(``ready_s``), the first step, the whole run. From them it gives each figure
the harnesses reported, and the user's figure: images over the process's
whole time.

    python tools/cnn_harnesses.py --data-dir ../shared/data/fashion-mnist
    # writes docs/results/cnn-harnesses.json

Speeds are comparable only within one run (the same machine, side by side).
"""
import argparse
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
from lab.commands import benchmark as bench  # noqa: E402

STEPS, WARMUP, BATCH, EPOCHS, BATCHES = 100, 10, 128, 2, 60
#: The benchmark's steps before: 10 after 2 (``benchmark12``), as ResNet-18's still are.
OLD = (10, 2)

#: The other harness, a user's script: ``sys.argv[1]`` is ours or pytorch, ``[2]`` the launch.
SCRIPT = r'''
import json, sys, time
launched = float(sys.argv[2])
B, N, E = %d, %d, %d
if sys.argv[1] == 'ours':
    import gluon_multigpu as gm
    devices = gm.cpu_devices(2)
    train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', B, num_train=B * N,
                                                   num_test=B, num_devices=2)
    ready = time.time()
    result = gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=E)
    epochs = [e.seconds for e in result.epochs]
else:
    import numpy as onp, torch
    from torch import nn
    rng = onp.random.default_rng(0)
    X = torch.tensor(rng.integers(0, 256, size=(B * N, 1, 28, 28)).astype('float32') / 255)
    y = torch.tensor(rng.integers(0, 10, size=B * N))
    ready = time.time()
    net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                        nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 128),
                        nn.ReLU(), nn.Linear(128, 10))
    opt, loss, epochs = torch.optim.SGD(net.parameters(), lr=0.3), nn.CrossEntropyLoss(), []
    for _ in range(E):
        tic = time.perf_counter()
        for i in range(N):
            opt.zero_grad()
            loss(net(X[i * B:(i + 1) * B]), y[i * B:(i + 1) * B]).backward()
            opt.step()
        epochs.append(time.perf_counter() - tic)
        with torch.no_grad():
            (net(X[:B]).argmax(1) == y[:B]).float().mean()
end = time.time()
print('RESULT ' + json.dumps({'ready_s': ready - launched, 'total_s': end - launched,
                              'epoch_seconds': epochs, 'images': B * N * E}))
''' % (BATCH, BATCHES, EPOCHS)


def _result(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[len('RESULT '):])
    raise SystemExit(f'{argv[1:3]} failed: {(proc.stderr.strip().splitlines() or ["?"])[-1]}')


def benchmark(variant, data_dir, steps=STEPS, warmup=WARMUP):
    """The benchmark's measurement, run as the benchmark runs it (``run_task``: a fresh process
    with its engine environment, timed from its launch), with its process's times."""
    kind = 'throughput' if variant == 'ours' else 'torch_throughput'
    r = bench.run_task({'kind': kind, 'variant': variant, 'model': 'simple-cnn', 'devices': 2,
                        'kvstore': 'device', 'batch': BATCH, 'steps': steps, 'warmup': warmup,
                        'data_dir': data_dir})
    if 'error' in r:
        raise SystemExit(f'benchmark/{variant}: {r["error"]}')
    images = BATCH * (steps + warmup)
    return {'steady': r['images_per_sec'], 'user': r['short_images_per_sec'],
            # the benchmark's short run until now: from just before the network was built
            'from_build': images / (r['total_s'] - r['ready_s']), 'ready_s': r['ready_s'],
            'startup_s': r['startup_s']}


def script(variant):
    """The other harness: a user's script, with its process's times."""
    r = _result([sys.executable, '-c', SCRIPT, variant, repr(time.time())])
    per_epoch = BATCH * BATCHES
    return {'steady': per_epoch / statistics.median(r['epoch_seconds']),
            'user': r['images'] / r['total_s'],
            # what that harness reported: from after the data was made
            'from_build': r['images'] / (r['total_s'] - r['ready_s']), 'ready_s': r['ready_s']}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--data-dir', required=True, metavar='DIR',
                        help='the Fashion-MNIST folder (the benchmark reads its test images)')
    parser.add_argument('--rounds', type=int, default=2, metavar='N', help='rounds (default 2)')
    parser.add_argument('--json', default=os.path.join(ROOT, 'docs', 'results',
                                                       'cnn-harnesses.json'), metavar='PATH')
    args = parser.parse_args(argv)
    runs = {k: [] for k in ('benchmark/ours', 'benchmark/pytorch', 'benchmark12/ours',
                            'benchmark12/pytorch', 'script/ours', 'script/pytorch')}
    for round_ in range(args.rounds):
        order = list(runs) if round_ % 2 == 0 else list(reversed(list(runs)))
        for key in order:
            harness, variant = key.split('/')
            if harness == 'script':
                runs[key].append(script(variant))
            else:
                runs[key].append(benchmark(variant, args.data_dir,
                                           *(OLD if harness == 'benchmark12' else ())))
            print(f'[round {round_ + 1}/{args.rounds}] {key}: {runs[key][-1]}', flush=True)
    medians = {}  # harness -> variant -> field -> median
    for key, rs in runs.items():
        harness, variant = key.split('/')
        medians.setdefault(harness, {})[variant] = {
            f: statistics.median(r[f] for r in rs) for f in rs[0]}
    ratios = {harness: {f: medians[harness]['ours'][f] / medians[harness]['pytorch'][f]
                        for f in ('steady', 'user', 'from_build')}
              for harness in medians}
    with atomic_write(args.json) as f:
        json.dump({'runs': runs, 'medians': medians, 'ratios': ratios, 'rounds': args.rounds,
                   'steps': STEPS, 'warmup': WARMUP, 'batches': BATCHES, 'epochs': EPOCHS,
                   **stamp()}, f, indent=2)
        f.write('\n')
    for harness, r in ratios.items():
        print(f'{harness}: ours / PyTorch: steady {r["steady"]:.2f}, a user\'s whole process '
              f'{r["user"]:.2f}, from just before the network is built {r["from_build"]:.2f}')
    print(f'written: {args.json}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

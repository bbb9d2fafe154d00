"""Measure ``--dtype bfloat16`` against float32 inside the package's own training (issue 54).

    python tools/bfloat16_train.py MODEL ROUNDS BATCHES KVSTORE [--json FILE] [--data-dir DIR]

Each dtype is one ``gm.Training`` on two CPU contexts (batch 128, 64 a context, the first
BATCHES*128 images of Fashion-MNIST, seed 0, no evaluation), built once; its first epoch warms
it up (compiling, converting). Then every round fits one more epoch of each dtype in turn, the
order reversed every other round, and takes images/s from the package's own epoch timer. On a
shared machine only the ratios of the same round mean anything: the file keeps every round.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gluon_multigpu as gm  # noqa: E402

DTYPES = ('float32', 'bfloat16')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('model', choices=['resnet18', 'simple-cnn'])
    p.add_argument('rounds', type=int)
    p.add_argument('batches', type=int)
    p.add_argument('kvstore')
    p.add_argument('--json', help='add this measurement to FILE (a list of rows, stamped)')
    p.add_argument('--data-dir', default='../shared/data/fashion-mnist')
    args = p.parse_args(argv)
    devices = gm.cpu_devices(2)
    from gluon_multigpu.base.machine import stamp  # pylint: disable=import-outside-toplevel
    from gluon_multigpu.features.precision import MixedPrecision  # pylint: disable=import-outside-toplevel
    train_iter, _ = gm.load_data_fashion_mnist(128, root=args.data_dir,
                                               num_train=128 * args.batches, num_test=128)
    runs = {}
    for dtype in DTYPES:
        hooks = [MixedPrecision(dtype)] if dtype != 'float32' else []
        runs[dtype] = gm.train(gm.get_model(args.model), train_iter, None, devices, num_epochs=1,
                               kvstore=args.kvstore, seed=0, progress_interval=0,
                               hooks=hooks).training
    speeds = {d: [] for d in DTYPES}
    for i in range(args.rounds):
        for dtype in (DTYPES if i % 2 == 0 else DTYPES[::-1]):
            record = runs[dtype].fit(1).epochs[-1]
            speeds[dtype].append(record.samples / record.seconds)
        print(f'round {i + 1}: ' + ', '.join(f'{d} {speeds[d][-1]:.1f}' for d in DTYPES)
              + ' images/s', flush=True)
    ratios = [b / f for f, b in zip(speeds['float32'], speeds['bfloat16'])]
    row = {'model': args.model, 'kvstore': args.kvstore, 'batch': 128, 'devices': 2,
           'rounds': args.rounds, 'batches_per_round': args.batches,
           'float32': speeds['float32'], 'bfloat16': speeds['bfloat16'], 'ratios': ratios,
           'median_ratio': statistics.median(ratios), 'min_ratio': min(ratios), **stamp()}
    print(f"{args.model}, kvstore {args.kvstore}: bfloat16/float32 per round "
          + ' '.join(f'{r:.2f}' for r in ratios) + f"; median {row['median_ratio']:.2f}")
    if args.json:
        rows = json.load(open(args.json)) if os.path.exists(args.json) else []
        with open(args.json, 'w') as f:
            json.dump(rows + [row], f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())

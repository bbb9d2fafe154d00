"""What the book's 10-epoch run ended with, checked: its checkpoint evaluated again, and its peak memory.

A maintainer's tool, not part of the package. For the run of docs/results.md
("The book's run"), from its checkpoint folder and the ``/usr/bin/time -v``
report of the process that ran (the last segment when it was resumed):

- the test accuracy of the checkpoint's weights (with the BatchNorm running
  statistics saved beside them), read back by the package's checkpoint code
  in a fresh process and evaluated on one context, where the run evaluated
  on two;
- the training accuracy of the weights on ``--num-check`` training images;
- the peak resident memory the time report gives.

    python tools/book_check.py --checkpoint-dir book-ckpt --time time.txt \
        --data-dir ../shared/data/fashion-mnist --out docs/results/book-run-check.json
"""
import argparse
import json
import os
import re
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402


def fail(message):
    """One line on standard error, exit status 2 (bad input)."""
    print(f'error: {message}', file=sys.stderr)
    raise SystemExit(2)


def peak_mib(time_report):
    """The "Maximum resident set size (kbytes)" of a ``/usr/bin/time -v`` report, in MiB."""
    try:
        with open(time_report, encoding='utf-8', errors='replace') as f:
            found = re.search(r'Maximum resident set size \(kbytes\): (\d+)', f.read())
    except OSError as e:
        fail(f'cannot read {time_report}: {e.strerror}: give the report of /usr/bin/time -v')
    if not found:
        fail(f'{time_report} has no "Maximum resident set size" line: '
             'give the report of /usr/bin/time -v for the run')
    return int(found.group(1)) / 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--checkpoint-dir', required=True, help="the run's checkpoint folder")
    parser.add_argument('--time', help='the /usr/bin/time -v report of the run (for its peak memory)')
    parser.add_argument('--data-dir', required=True, help='the four Fashion-MNIST IDX .gz files')
    parser.add_argument('--num-check', type=int, default=10000,
                        help='training images to measure the training accuracy on (default 10000)')
    parser.add_argument('--out', default='book-run-check.json', help='where to write the figures')
    args = parser.parse_args(argv)
    peak = peak_mib(args.time) if args.time else None  # refused before minutes of evaluation

    import numpy as onp
    import mxnet as mx
    from mxnet import gluon, np, npx
    import gluon_multigpu as gm
    from gluon_multigpu.checkpoints.checkpoint_store import CheckpointStore
    npx.set_np()
    warnings.simplefilter('ignore')  # MXNet's advice on Sequential of HybridBlocks

    devices = [mx.cpu(0)]
    try:
        # The package's own reading: the manifest, each file against its recorded hash.
        state = CheckpointStore(args.checkpoint_dir, {}).load(check_config=False)
        if state is None:
            fail(f"{args.checkpoint_dir} holds no checkpoint: give the book run's "
                 '--checkpoint-dir')
        train_iter, test_iter = gm.load_data('fashion-mnist', 500, root=args.data_dir)
        net = gm.resnet18(10)
        net.initialize(ctx=devices)
        net(np.zeros((2, 1, 28, 28), ctx=devices[0]))  # shapes, for the parameters to load into
        # The Trainer only receives the optimizer state that restore loads with the weights.
        state.restore(net, gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.2},
                                         kvstore=None), devices)
    except gm.GluonMultiGPUError as e:
        fail(e)
    net.hybridize()

    start = time.perf_counter()
    images, labels = train_iter.images, train_iter.labels
    check = onp.random.RandomState(1).permutation(len(labels))[:args.num_check]
    check_iter = gm.ArrayLoader(images[check], labels[check], 500, shuffle=False)
    out = {'checkpoint_epoch': state.epoch, 'partial': state.partial is not None,
           'test_acc': gm.evaluate_accuracy_gpus(net, test_iter, devices),
           'train_acc': gm.evaluate_accuracy_gpus(net, check_iter, devices),
           'num_check': len(check), 'seconds': time.perf_counter() - start}
    print(f"test acc {out['test_acc']:.4f}, train acc {out['train_acc']:.4f} "
          f'on {len(check)} training images', flush=True)
    if peak is not None:
        out['peak_mib'] = peak
        print(f'peak resident memory: {peak:,.0f} MiB')
    out.update(stamp())
    with atomic_write(args.out) as f:
        f.write(json.dumps(out, indent=1) + '\n')
    print(f'wrote {args.out}')

if __name__ == '__main__':
    main()

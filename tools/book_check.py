"""What the book's 10-epoch run ended with, checked: its checkpoint evaluated again, and its peak memory.

A maintainer's tool, not part of the package. For the run of docs/results.md
("The book's run"), from its checkpoint folder and the ``/usr/bin/time -v``
report of the process that ran (the last segment when it was resumed):

- the test accuracy of the checkpoint's weights with the BatchNorm running
  statistics it was saved with, on one context (independent of the run's own
  evaluation on two);
- the training accuracy of the weights on ``--num-check`` training images;
- the peak resident memory the time report gives.

    python tools/book_check.py --checkpoint-dir book-ckpt --time time.txt \
        --data-dir ../shared/data/fashion-mnist --out docs/results/book-run-check.json
"""
import argparse
import glob
import json
import os
import re
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.base.atomic import atomic_write  # noqa: E402
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
    if not os.path.isfile(os.path.join(args.checkpoint_dir, 'manifest.json')):
        fail(f"{args.checkpoint_dir} holds no checkpoint (manifest.json): "
             "give the book run's --checkpoint-dir")

    import numpy as onp
    import mxnet as mx
    from mxnet import np, npx
    import gluon_multigpu as gm
    npx.set_np()
    warnings.simplefilter('ignore')  # MXNet's advice on Sequential of HybridBlocks

    with open(os.path.join(args.checkpoint_dir, 'manifest.json'), encoding='utf-8') as f:
        manifest = json.load(f)
    params = os.path.join(args.checkpoint_dir, f"ckpt-{manifest['sequence']:06d}.params")
    if not os.path.isfile(params):
        params = sorted(glob.glob(os.path.join(args.checkpoint_dir, 'ckpt-*.params')))[-1]
    ctx = mx.cpu(0)
    net = gm.resnet18(10)
    net.initialize(ctx=ctx)
    net(np.zeros((2, 1, 28, 28), ctx=ctx))
    net.load_parameters(params, ctx=ctx)
    net.hybridize()
    from gluon_multigpu.errors import DataError
    try:
        train_x, train_y = gm.read_split(args.data_dir, 'train')
        test_x, test_y = gm.read_split(args.data_dir, 'test')
    except DataError as e:
        fail(f'{e}: give --data-dir the four Fashion-MNIST IDX .gz files')

    def batches(x, y, size):
        for i in range(0, len(x), size):
            images = onp.asarray(x[i:i + size], dtype='float32').reshape(-1, 1, 28, 28) / 255
            yield np.array(images, ctx=ctx), y[i:i + size]

    def accuracy(x, y):
        right = 0
        for images, labels in batches(x, y, 500):
            right += int((net(images).argmax(axis=1).asnumpy() == labels).sum())
        return right / len(x)

    start = time.perf_counter()
    order = onp.random.RandomState(1).permutation(len(train_x))
    check = order[:args.num_check]
    out = {'checkpoint': os.path.basename(params), 'epoch': manifest['epoch'],
           'partial': manifest.get('partial') is not None}
    out['test_acc_saved_stats'] = accuracy(test_x, test_y)
    out['train_acc_saved_stats'] = accuracy(train_x[check], train_y[check])
    print(f"saved statistics: test acc {out['test_acc_saved_stats']:.4f}, "
          f"train acc {out['train_acc_saved_stats']:.4f}", flush=True)
    out['num_check'] = len(check)
    out['seconds'] = time.perf_counter() - start
    if peak is not None:
        out['peak_mib'] = peak
        print(f"peak resident memory: {out['peak_mib']:,.0f} MiB")
    out.update(stamp())
    with atomic_write(args.out) as f:
        f.write(json.dumps(out, indent=1) + '\n')
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()

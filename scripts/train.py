#!/usr/bin/env python3
"""Train the book's ResNet-18 (or the lab's simple CNN) data-parallel on several devices.

The loop of d2l 13.6 "Concise Implementation for Multiple GPUs": parameters on
every device, each batch split across them, gradients summed by the kvstore.
Without GPUs, ``--cpu-devices N`` runs the same code on N CPU contexts.
"""
import argparse
import math
import os
import sys
import tempfile

import gluon_multigpu as gm  # loads MXNet only on first use, after the engine settings
from gluon_multigpu import names, runtime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import OneLineParser  # noqa: E402  (shared by the scripts)

EPILOG = """\
examples:
  %(prog)s --num-gpus 2                       the book's 2-GPU run (batch 512, lr 0.2)
  %(prog)s --cpu-devices 2 --model simple-cnn --num-epochs 2 --data-dir DIR
  %(prog)s --cpu-devices 2 --kvstore local device --json runs.json --plot acc.png

Bad input (a device that does not exist, a batch that cannot be split, missing
or corrupt data, a non-positive number, an output directory that does not
exist or takes no new files) stops before training with one line on stderr
and exit status 2.
"""


def positive_int(text):
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not an integer; give a whole number '
                                         'of at least 1') from None
    if value < 1:
        raise argparse.ArgumentTypeError(f'{value} is not positive; give a whole number '
                                         'of at least 1')
    return value


def non_negative_int(text):
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not an integer; give a whole number '
                                         'of 0 or more') from None
    if value < 0:
        raise argparse.ArgumentTypeError(f'{value} is negative; give a whole number of 0 or more')
    return value


def positive_float(text):
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a number; give a number '
                                         'greater than 0') from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f'{text} is not a positive finite number; give a '
                                         'number greater than 0')
    return value


def non_negative_float(text):
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a number; give a number '
                                         'of 0 or more') from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f'{text} is not a finite number of 0 or more; '
                                         'give 0 or more')
    return value


def build_parser():
    """Return the argument parser of this script."""
    p = OneLineParser(description=__doc__.splitlines()[0], epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument('--num-gpus', type=positive_int, metavar='N',
                       help='train on gpu(0)..gpu(N-1) (default: all GPUs, or the CPU if none)')
    where.add_argument('--cpu-devices', type=positive_int, metavar='N',
                       help='train on N CPU contexts cpu(0)..cpu(N-1) instead of GPUs')
    p.add_argument('--kvstore', nargs='+', choices=names.KVSTORES, default=['device'],
                   metavar='KV', help='gradient synchronisation: local (sum on the CPU) or device '
                   '(sum on the devices); several run in turn on the same data and initial '
                   'weights and end with a side-by-side table (default: device)')
    p.add_argument('--batch-size', type=positive_int, metavar='N',
                   help='total batch size over all devices (default: 256 per device)')
    p.add_argument('--lr', type=positive_float, metavar='LR',
                   help='SGD learning rate (default: 0.1 per 256 samples of batch, '
                   'as the book scales it)')
    p.add_argument('--num-epochs', type=positive_int, default=10, metavar='N',
                   help='passes over the training set (default: 10)')
    p.add_argument('--model', choices=names.MODEL_NAMES, default='resnet18',
                   help='network (default: resnet18)')
    p.add_argument('--dataset', choices=names.DATASET_NAMES, default='fashion-mnist',
                   help='data set (default: fashion-mnist)')
    p.add_argument('--data-dir', metavar='DIR',
                   help='directory with the four IDX .gz files '
                   '(default: ~/.mxnet/datasets/<dataset>)')
    p.add_argument('--download', action='store_true',
                   help="download missing files from MXNet's mirror (needs internet)")
    p.add_argument('--num-train', type=positive_int, metavar='N',
                   help='use only the first N training images (default: all 60000)')
    p.add_argument('--num-test', type=positive_int, metavar='N',
                   help='use only the first N test images (default: all 10000)')
    p.add_argument('--seed', type=non_negative_int, default=0,
                   help='seed of the initial weights and the data order (default: 0)')
    p.add_argument('--plot', metavar='PATH', help='write the test-accuracy curve as a PNG')
    p.add_argument('--json', metavar='PATH', help='write every figure of the run(s) as JSON')
    p.add_argument('--book-literal', action='store_true',
                   help="run the text's loop verbatim (nn.Block residuals, no hybridization, "
                   'loss and accuracy read back every step) instead of the fast path')
    p.add_argument('--progress-interval', type=non_negative_float, default=10.0,
                   metavar='SECONDS',
                   help='seconds between progress lines within an epoch on stderr; '
                   '0 turns them off (default: 10)')
    return p


def parse_args(argv=None):
    """Parse the command line (``sys.argv[1:]`` when ``argv`` is None)."""
    return build_parser().parse_args(argv)


def select_devices(num_gpus, cpu_devices):
    """Return ``(devices, note)`` for the device flags; ``note`` says what was chosen and why."""
    if cpu_devices is not None:
        return gm.cpu_devices(cpu_devices), None
    if num_gpus is not None:
        return gm.gpu_devices(num_gpus), None
    devices = gm.try_all_gpus()
    if devices[0].device_type == 'cpu':
        return devices, ('no GPU found: training on the CPU; use --cpu-devices N to split '
                         'each batch across N CPU contexts')
    return devices, None


def check_output_path(path, flag):
    """Raise GluonMultiGPUError unless ``path`` can be written (checked before training).

    Whether the directory takes new files is tried out, with a temporary file
    created and removed the way the output will be written: permission bits
    do not tell (root ignores them; /proc and /sys refuse new files).
    """
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise gm.GluonMultiGPUError(f'{flag} {path} is a directory; give a file name')
    if not os.path.isdir(directory):
        raise gm.GluonMultiGPUError(f'{flag} {path}: directory {directory} does not exist; '
                                    'create it first')
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=f'.{os.path.basename(path)}.',
                                         suffix='.tmp'):
            pass
    except OSError as e:
        raise gm.GluonMultiGPUError(f'{flag} {path}: cannot create files in {directory} '
                                    f'({e.strerror}); choose a writable directory') from None


def make_loaders(args, batch_size, num_devices):
    """Load the data set; return ``(train_iter, test_iter, note)``."""
    num_train = args.num_train or gm.DATASETS[args.dataset]['train']
    remainder = num_train % batch_size
    # A last training batch smaller than the number of devices cannot be
    # split; drop it rather than stop in the middle of an epoch.
    last_batch = 'discard' if 0 < remainder < num_devices else 'keep'
    train_iter, test_iter = gm.load_data(
        args.dataset, batch_size, root=args.data_dir, download=args.download,
        num_train=args.num_train, num_test=args.num_test, seed=args.seed, last_batch=last_batch)
    note = None
    if last_batch == 'discard':
        note = (f'dropping the last {remainder} training sample(s) of each epoch: '
                f'fewer than the {num_devices} devices')
    return train_iter, test_iter, note


def train_one(args, kvstore, devices, lr, train_iter, test_iter, out):
    """Train a fresh model with one kvstore; print progress; return the TrainResult."""
    train_iter.epoch = 0  # every kvstore sees the same sequence of batches
    num_batches = len(train_iter)

    def on_progress(epoch, batches, samples, seconds):
        print(f'  epoch {epoch}: {batches}/{num_batches} batches, {seconds:.0f} s, '
              f'{samples / seconds:.0f} samples/s', file=sys.stderr, flush=True)

    def on_epoch(record):
        print(gm.epoch_line(record, args.num_epochs), file=out, flush=True)

    classes = gm.DATASETS[args.dataset]['classes']
    initializer = gm.default_initializer(args.model)
    if args.book_literal:
        net = gm.book_resnet18(classes) if args.model == 'resnet18' else gm.simple_cnn(classes)
        return gm.train_book(net, train_iter, test_iter, devices, num_epochs=args.num_epochs,
                             lr=lr, kvstore=kvstore, batch_size=train_iter.batch_size,
                             seed=args.seed, initializer=initializer, on_epoch=on_epoch)
    return gm.train(gm.get_model(args.model, classes), train_iter, test_iter, devices,
                    num_epochs=args.num_epochs, lr=lr, kvstore=kvstore, seed=args.seed,
                    initializer=initializer, on_epoch=on_epoch,
                    on_progress=on_progress if args.progress_interval > 0 else None,
                    progress_interval=args.progress_interval)


def write_outputs(args, results, config):
    """Write the ``--plot`` and ``--json`` files, each atomically."""
    if args.plot:
        devices = ', '.join(results[0].devices)
        animator = gm.Animator(xlabel='epoch', ylabel='test acc',
                               legend=[f'kvstore {r.kvstore}' for r in results],
                               xlim=[1, args.num_epochs],
                               title=f'{args.model} on {args.dataset}, [{devices}]')
        for i in range(args.num_epochs):
            animator.add(i + 1, [r.test_acc[i] for r in results])
        animator.save(args.plot)
    if args.json:
        gm.write_json(args.json, {'config': config, 'runs': [r.to_dict() for r in results]})


def run(args, out=None):
    """Check the input, train once per kvstore, report; return the list of TrainResult."""
    out = out or sys.stdout
    devices, note = select_devices(args.num_gpus, args.cpu_devices)
    batch_size = args.batch_size or 256 * len(devices)
    if batch_size < len(devices):
        raise gm.DeviceError(f'a batch of {batch_size} cannot be split across {len(devices)} '
                             f'devices; use --batch-size {len(devices)} or more')
    lr = args.lr or 0.1 * batch_size / 256
    for path, flag in ((args.plot, '--plot'), (args.json, '--json')):
        if path:
            check_output_path(path, flag)
    # Loaded before any training, so that bad data stops the run at once.
    train_iter, test_iter, data_note = make_loaders(args, batch_size, len(devices))
    kvstores = list(dict.fromkeys(args.kvstore))
    for message in (note, data_note):
        if message:
            print(message, file=out)
    print(f'training {args.model} on {args.dataset}: {train_iter.num_samples} train / '
          f'{len(test_iter.labels)} test images, batch {batch_size} '
          f'({batch_size / len(devices):g} per device), lr {lr:g}, {args.num_epochs} epoch(s), '
          f'devices {devices}', file=out, flush=True)
    results = []
    for kvstore in kvstores:
        if len(kvstores) > 1:
            print(f'-- kvstore {kvstore}', file=out, flush=True)
        result = train_one(args, kvstore, devices, lr, train_iter, test_iter, out)
        print(result.final_line(), file=out, flush=True)
        results.append(result)
    if len(results) > 1:
        print(gm.comparison_table(results), file=out)
    config = dict(vars(args), batch_size=batch_size, lr=lr, kvstore=kvstores,
                  devices=[str(d) for d in devices])
    write_outputs(args, results, config)
    return results


def engine_devices(args):
    """How many CPU contexts will train (None: not known before MXNet looks for GPUs)."""
    if args.cpu_devices is not None:
        return args.cpu_devices
    return 0 if args.num_gpus is not None else None


def main(argv=None):
    """Run the script; return the exit status (0, 2 for bad input, 130 if interrupted)."""
    args = parse_args(argv)
    # Before MXNet loads: its OpenMP threads are fixed when the library loads.
    runtime.apply_engine_env(num_cpu_devices=engine_devices(args))
    try:
        run(args)
    except gm.GluonMultiGPUError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    return 0


if __name__ == '__main__':
    sys.exit(main())

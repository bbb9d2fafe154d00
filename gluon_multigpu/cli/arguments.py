"""The programs' command lines: argument types, parsers and flags, and how errors name the flags.

Every program parses with a ``OneLineParser`` (a bad argument: one line,
status 2), whose types say what is wrong with a value and what to give
instead. ``engine_devices`` reads the device flags alone, before the package
loads MXNet (``console.prepare_engine``). The library names its arguments in
backquotes (`checkpoint_dir`); ``FLAGS`` spells them as these command lines
do (``error_line``). Nothing in this module loads MXNet.
"""
import argparse
import math
import os

#: Most CPU contexts a script accepts: MXNet starts a worker thread per
#: context, and past this many the contexts only share the same cores.
MAX_CPU_DEVICES = 64
#: Most GPUs a script accepts (MXNet's peer-to-peer code assumes far fewer).
MAX_GPUS = 64
#: Largest seed: MXNet's generator takes a 32-bit unsigned seed.
MAX_SEED = 2**32 - 1


class UsageError(Exception):
    """A bad command line or environment: one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` that reports a bad argument in one line (no usage block), status 2.

    Flags must be written in full (no ``--sync`` for ``--sync-bn``): the
    engine settings are chosen from the command line before this parser
    runs, by the full names.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault('allow_abbrev', False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f'{self.prog}: error: {message} (see --help)\n')


def _number(text, kind, low, high, wanted, above_low=False):
    """Parse ``text`` as ``kind`` in ``[low, high]`` (``(low, high]`` with ``above_low``).

    Raises ``ArgumentTypeError`` saying what is wrong and what to give instead.
    """
    try:
        value = kind(text)
    except ValueError:
        noun = 'an integer' if kind is int else 'a number'
        raise argparse.ArgumentTypeError(f'{text!r} is not {noun}; give {wanted}') from None
    if kind is float and not (math.isfinite(value) and value >= low and
                              not (above_low and value == low)):
        problem = ('is not a positive finite number' if above_low else
                   f'is not a finite number of {low:g} or more')
    elif value < low:
        problem = {0: 'is negative', 1: 'is not positive'}.get(low, f'is below {low}')
    elif value > high:
        problem = f'is above {high}' if kind is int else f'is above {high:g}'.replace('e+0', 'e')
    else:
        return value
    raise argparse.ArgumentTypeError(f'{text} {problem}; give {wanted}')


def int_in(low, high):
    """argparse type: a whole number from ``low`` to ``high``."""
    def parse(text):
        return _number(text, int, low, high, f'a whole number from {low} to {high}')
    parse.__name__ = 'integer'
    return parse


def positive_float(text):
    """argparse type: a number greater than 0, at most 1e6."""
    return _number(text, float, 0, 1e6, 'a number greater than 0 and at most 1e6', True)


def non_negative_float(text):
    """argparse type: a number from 0 to 1e6."""
    return _number(text, float, 0, 1e6, 'a number from 0 to 1e6')


def path_of(kind):
    """argparse type: a path that is not empty (``''`` would mean the current folder, or none).

    ``kind`` says what to give instead ("a directory", "a file name").
    """
    def parse(text):
        if not text.strip():
            raise argparse.ArgumentTypeError(f'{text!r} is an empty path; give {kind}')
        return text
    parse.__name__ = 'path'
    return parse


#: Samples per batch, epochs: more than any run here could use, small enough to stay exact.
batch_size = int_in(1, 10**6)
num_epochs = int_in(1, 10**5)
seed = int_in(0, MAX_SEED)


def split_weights(text):
    """argparse type of --split: ``even`` (None), ``auto``, or positive weights ``W1,W2,...``."""
    if text == 'even':
        return None
    if text == 'auto':
        return text
    try:
        weights = [float(w) for w in text.split(',')]
    except ValueError:
        weights = []
    if not weights or not all(math.isfinite(w) and 0 < w <= 1e6 for w in weights):
        raise argparse.ArgumentTypeError(f'{text!r} is neither even, auto nor positive weights; '
                                         'give even, auto or one weight per device, e.g. 1,3')
    return weights


def add_device_flags(p, gpu_help, cpu_help):
    """Add the mutually exclusive ``--num-gpus``/``--cpu-devices`` pair to parser ``p``."""
    where = p.add_mutually_exclusive_group()
    where.add_argument('--num-gpus', type=int_in(1, MAX_GPUS), metavar='N', help=gpu_help)
    where.add_argument('--cpu-devices', type=int_in(1, MAX_CPU_DEVICES), metavar='N',
                       help=cpu_help)
    return where


def add_run_flags(p, models, datasets, seed_help='the same in every run'):
    """Add what a training run is made of: --model, --dataset, --data-dir, subsets and --seed.

    ``models`` and ``datasets`` are the choices (the package's names).
    """
    p.add_argument('--model', choices=list(models), default='resnet18',
                   help='network (default: resnet18)')
    p.add_argument('--dataset', choices=list(datasets), default='fashion-mnist',
                   help='data set (default: fashion-mnist)')
    p.add_argument('--data-dir', metavar='DIR', type=path_of('a directory'),
                   help='directory with the four IDX .gz files '
                   '(default: ~/.mxnet/datasets/<dataset>)')
    p.add_argument('--num-train', type=int_in(1, 10**8), metavar='N',
                   help='use only the first N training images (default: all 60000)')
    p.add_argument('--num-test', type=int_in(1, 10**8), metavar='N',
                   help='use only the first N test images (default: all 10000)')
    p.add_argument('--seed', type=seed, default=0,
                   help=f'seed of the initial weights and the data order, 0 to {MAX_SEED}, '
                   f'{seed_help} (default: 0)')


def sweep_parser(doc, epilog, first, cpu_default, what):
    """A parser for a script that sweeps device counts ``first``, 2 x ``first``, ... up to N.

    ``cpu_default`` says what it sweeps without GPUs and flags; ``what`` ends
    the help of ``--counts`` ("device counts to ...").
    """
    counts = f'counts {first}, {2 * first if first > 1 else 2}, ... up to N and N'
    p = script_parser(doc, epilog, f'GPUs, {counts} (default: all GPUs)',
                      f'CPU contexts, {counts} (default without GPUs: {cpu_default})')
    p.add_argument('--counts', type=int_in(1, MAX_CPU_DEVICES), nargs='+', metavar='N',
                   help=f'device counts to {what} (default: see above)')
    return p


def script_parser(doc, epilog, gpu_help, cpu_help):
    """A ``OneLineParser`` for a script, with its ``--num-gpus``/``--cpu-devices`` pair.

    ``doc`` is the script's docstring (its first line describes it), ``epilog``
    ends ``--help``; the two help texts say what the device flags mean there.
    """
    p = OneLineParser(description=doc.splitlines()[0], epilog=epilog,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_flags(p, gpu_help, cpu_help)
    return p


class _QuietParser(argparse.ArgumentParser):
    """A parser that raises ``UsageError`` instead of printing and exiting (no abbreviations)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        raise UsageError(message)


def engine_devices(argv):
    """How many CPU contexts a command line trains on side by side; None if not known.

    Reads only the device flags (the full parser needs the package, which
    needs the settings first); a bad value is left for the full parser.
    """
    p = _QuietParser(add_help=False)
    add_device_flags(p, None, None)
    try:
        args, _ = p.parse_known_args(argv)
    except UsageError:
        return None
    if args.cpu_devices is not None:
        return args.cpu_devices
    if args.num_gpus is not None:
        return 0
    # Neither flag: all GPUs, or one CPU context when there are none (no NVIDIA
    # device node: MXNet would find no GPU either).
    return None if os.path.exists('/dev/nvidiactl') else 1


def add_data_flags(p, what='its images', default=True):
    """Add --data-dir and --download, as every program that reads Fashion-MNIST takes them.

    ``default``: whether the help names MXNet's folder as the default (``what`` says it
    otherwise).
    """
    p.add_argument('--data-dir', metavar='DIR', type=path_of('a directory'),
                   help=f'Fashion-MNIST folder with the four IDX .gz files; {what}' +
                   (' (default: ~/.mxnet/datasets/fashion-mnist)' if default else ''))
    p.add_argument('--download', action='store_true',
                   help="download missing files into that folder from MXNet's mirror (needs "
                   'internet)')


def add_sweep_flags(p, default):
    """Add --results, --resume and --overwrite: the file every measurement is kept in."""
    p.add_argument('--results', metavar='PATH', type=path_of('a file name'),
                   help='JSON file that keeps every measurement as soon as it is made (replaced '
                   'atomically, marked partial until the run is complete), so that Ctrl-C or a '
                   f'crash loses only the measurement in progress (default: {default})')
    again = p.add_mutually_exclusive_group()
    again.add_argument('--resume', action='store_true',
                   help='continue the run kept in --results: what it measured is not measured '
                   'again (the settings must be the same)')
    again.add_argument('--overwrite', action='store_true',
                   help='replace the results file kept in --results by a new run (it stays as it '
                   'was until the first new measurement is written); without it or --resume, '
                   'an existing results file is refused')


#: How the library's argument names read on the command line (see ``GluonMultiGPUError``).
FLAGS = {'cpu_devices': '--cpu-devices', 'num_gpus': '--num-gpus',
         'checkpoint_dir': '--checkpoint-dir', 'resume=True': '--resume',
         'overwrite=True': '--overwrite',
         'num_epochs': '--num-epochs', 'data_dir': '--data-dir', 'download=True': '--download',
         'dataset': '--dataset', 'batch_size': '--batch-size', 'num_train': '--num-train',
         'lr': '--lr', 'counts': '--counts', 'kvstore': '--kvstore',
         'global_batch': '--global-batch', 'dtype': '--dtype', 'split': '--split',
         'sync_bn': '--sync-bn', 'model': '--model', 'book_literal': '--book-literal',
         'batch_per_device': '--batch-per-device', 'results': '--results', 'quick': '--quick',
         'models': '--models', 'steps': '--steps', 'rounds': '--rounds',
         'num_test': '--num-test', 'stall_timeout': '--stall-timeout',
         'max_in_flight': '--max-in-flight', 'project_to': '--project-to',
         'accumulate': '--accumulate', 'clip_grad_norm': '--clip-grad-norm',
         'lr_schedule': '--lr-schedule', 'warmup_steps': '--warmup-steps',
         'tensorboard': '--tensorboard', 'metrics': '--metrics', 'log_every': '--log-every',
         'profile': '--profile', 'profile_file': '--profile-file'}


def error_line(error):
    """The one line printed for a ``GluonMultiGPUError``: its message with the CLI's flag names."""
    return f'error: {error.describe(FLAGS)}'

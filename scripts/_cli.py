"""What the scripts share: a one-line argument parser, argument types, output-path checks.

Nothing here imports MXNet: the scripts parse their arguments and put the
engine settings into the environment before MXNet loads.
"""
import argparse
import math
import os
import sys

from gluon_multigpu import runtime
from gluon_multigpu.errors import GluonMultiGPUError
from gluon_multigpu.reporting import check_writable


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` that reports a bad argument in one line (no usage block), status 2."""

    def error(self, message):
        self.exit(2, f'{self.prog}: error: {message} (see --help)\n')


def _number(text, kind, in_range, out_of_range, wanted):
    """Parse ``text`` as ``kind``; raise ArgumentTypeError unless ``in_range(value)``.

    The messages say what is wrong (``'x' is not an integer``, ``0 is not
    positive``) and what to give instead.
    """
    try:
        value = kind(text)
    except ValueError:
        noun = 'an integer' if kind is int else 'a number'
        raise argparse.ArgumentTypeError(f'{text!r} is not {noun}; give {wanted}') from None
    if not in_range(value):
        raise argparse.ArgumentTypeError(f'{text} {out_of_range}; give {wanted}')
    return value


def positive_int(text):
    """argparse type: an integer >= 1."""
    return _number(text, int, lambda v: v >= 1, 'is not positive', 'a whole number of at least 1')


def non_negative_int(text):
    """argparse type: an integer >= 0."""
    return _number(text, int, lambda v: v >= 0, 'is negative', 'a whole number of 0 or more')


def positive_float(text):
    """argparse type: a finite number > 0."""
    return _number(text, float, lambda v: math.isfinite(v) and v > 0,
                   'is not a positive finite number', 'a number greater than 0')


def non_negative_float(text):
    """argparse type: a finite number >= 0."""
    return _number(text, float, lambda v: math.isfinite(v) and v >= 0,
                   'is not a finite number of 0 or more', 'a number of 0 or more')


def script_parser(doc, epilog, gpu_help, cpu_help):
    """A ``OneLineParser`` for a script, with its ``--num-gpus``/``--cpu-devices`` pair.

    ``doc`` is the script's docstring (its first line describes it), ``epilog``
    ends ``--help``; the two help texts say what the device flags mean there.
    """
    p = OneLineParser(description=doc.splitlines()[0], epilog=epilog,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument('--num-gpus', type=positive_int, metavar='N', help=gpu_help)
    where.add_argument('--cpu-devices', type=positive_int, metavar='N', help=cpu_help)
    return p


def engine_devices(args):
    """How many CPU contexts will run side by side, from ``--cpu-devices``/``--num-gpus``.

    None when neither is given: not known before MXNet looks for GPUs.
    """
    if args.cpu_devices is not None:
        return args.cpu_devices
    return 0 if args.num_gpus is not None else None


def run_main(argv, build_parser, run):
    """The ``main`` of a measuring script; return its exit status.

    Parses ``argv``, puts the engine settings for ``engine_devices(args)``
    CPU contexts into the environment before MXNet loads, then ``run(args)``:
    0 when done, 2 with one line for bad input, 130 when interrupted.
    """
    args = build_parser().parse_args(argv)
    runtime.apply_engine_env(num_cpu_devices=engine_devices(args))
    try:
        run(args)
    except GluonMultiGPUError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    return 0


def check_output_path(path, flag):
    """Raise GluonMultiGPUError unless the file ``path`` can be written (check before any work)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise GluonMultiGPUError(f'{flag} {path} is a directory; give a file name')
    if not os.path.isdir(directory):
        raise GluonMultiGPUError(f'{flag} {path}: directory {directory} does not exist; '
                                 'create it first')
    check_writable(directory, f'{flag} {path}')

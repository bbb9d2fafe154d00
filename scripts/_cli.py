"""What the scripts share: a one-line argument parser, argument types, output-path checks.

Nothing here imports MXNet: the scripts parse their arguments and put the
engine settings into the environment before MXNet loads.
"""
import argparse
import math
import os

from gluon_multigpu.errors import GluonMultiGPUError
from gluon_multigpu.reporting import check_writable


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` that reports a bad argument in one line (no usage block), status 2."""

    def error(self, message):
        self.exit(2, f'{self.prog}: error: {message} (see --help)\n')


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


def check_output_path(path, flag):
    """Raise GluonMultiGPUError unless the file ``path`` can be written (check before any work)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise GluonMultiGPUError(f'{flag} {path} is a directory; give a file name')
    if not os.path.isdir(directory):
        raise GluonMultiGPUError(f'{flag} {path}: directory {directory} does not exist; '
                                 'create it first')
    check_writable(directory, f'{flag} {path}')

"""What the lab's programs share, by one name: ``common.int_in``, ``common.start``, ``common.stopping_main``.

Each piece lives in the package's module of its responsibility (``gluon_multigpu.cli``),
and is named here too, so that a lab program imports what it shares from one place:

- ``arguments``: argument types and parsers, the device flags, ``error_line``
  and ``flag`` (how an error names the flags);
- ``console``: the start of a program (engine settings before MXNet loads,
  the handlers until its own), quiet console streams, how it was started
  (``program``, ``command_line``), and its ``stop_request``.

The flags only the lab's programs take (a sweep's device counts, a run's
model and data, the results file) are defined here. Nothing in this module
loads MXNet.
"""
import argparse

from gluon_multigpu.base.engine import cores
from gluon_multigpu.base.values import non_negative_float, path_of, positive_float, split_weights
from gluon_multigpu.errors import flag
from gluon_multigpu.cli.arguments import (MAX_CPU_DEVICES, MAX_SEED, OneLineParser, UsageError,
                                          add_device_flags, engine_devices, error_line, int_in,
                                          seed)
from gluon_multigpu.cli.console import (apply_engine_settings, command_line, prepare_engine,
                                        program, quiet_console, resume_command, say_quietly, start,
                                        started, stop_request, stopping_main)

# the names imported above, and this module's own
__all__ = [name for name in dir() if not name.startswith('_') and name != 'argparse'] + [
    'batch_size', 'num_epochs', 'add_run_flags', 'sweep_parser', 'script_parser',
    'add_data_flags', 'add_sweep_flags']

#: Samples per batch, epochs: more than any run here could use, small enough to stay exact.
batch_size = int_in(1, 10**6)
num_epochs = int_in(1, 10**5)


def add_run_flags(p, models, datasets, seed_help='the same in every run'):
    """Add what a training run is made of: --model, --dataset, --data-dir, subsets and --seed.

    ``models`` and ``datasets`` are the choices (the package's names).
    """
    p.add_argument('--model', choices=list(models), default='resnet18',
                   help='network (default: resnet18)')
    p.add_argument('--dataset', choices=list(datasets), default='fashion-mnist',
                   help='data set (default: fashion-mnist)')
    p.add_argument('--data-dir', metavar='DIR', type=path_of('a directory'), help='directory with '
                   'the four IDX .gz files (default: ~/.mxnet/datasets/<dataset>)')
    p.add_argument('--num-train', type=int_in(1, 10**8), metavar='N',
                   help='use only the first N training images (default: all 60000)')
    p.add_argument('--num-test', type=int_in(1, 10**8), metavar='N',
                   help='use only the first N test images (default: all 10000)')
    p.add_argument('--seed', type=seed, default=0, help='seed of the initial weights and the data '
                   f'order, 0 to {MAX_SEED}, {seed_help} (default: 0)')


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


def add_data_flags(p, what='its images', default=True):
    """Add --data-dir and --download, as every program that reads Fashion-MNIST takes them.

    ``default``: whether the help names MXNet's folder as the default (``what`` says it
    otherwise).
    """
    p.add_argument('--data-dir', metavar='DIR', type=path_of('a directory'),
                   help=f'Fashion-MNIST folder with the four IDX .gz files; {what}' +
                   (' (default: ~/.mxnet/datasets/fashion-mnist)' if default else ''))
    p.add_argument('--download', action='store_true', help='download missing files into that '
                   "folder from MXNet's mirror (needs internet)")


def add_sweep_flags(p, default):
    """Add --results, --resume and --overwrite: the file every measurement is kept in."""
    p.add_argument('--results', metavar='PATH', type=path_of('a file name'),
                   help='JSON file that keeps every measurement as soon as it is made (replaced '
                   'atomically, marked partial until the run is complete), so that Ctrl-C or a '
                   f'crash loses only the measurement in progress (default: {default})')
    again = p.add_mutually_exclusive_group()
    again.add_argument('--resume', action='store_true', help='continue the run kept in --results: '
                   'what it measured is not measured again (the settings must be the same)')
    again.add_argument('--overwrite', action='store_true', help='replace the results file kept in '
                   '--results by a new run (it stays as it was until the first new measurement is '
                   'written); without it or --resume, an existing results file is refused')

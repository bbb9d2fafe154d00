"""The programs' command lines: argument types, parsers and flags, and how errors name the flags.

Every program parses with a ``OneLineParser`` (a bad argument: one line,
status 2), whose types say what is wrong with a value and what to give
instead. ``engine_devices`` reads the device flags alone, before the package
loads MXNet (``console.prepare_engine``). The library names its arguments in
backquotes (`checkpoint_dir`); ``errors.flag`` spells them as these command
lines do (``error_line``). ``add_config_flags`` makes a flag of each field of a
config (``config.RunConfig``). Nothing in this module loads MXNet.
"""
import argparse
import dataclasses
import os
import sys

from ..base.values import MAX_CPU_DEVICES, MAX_GPUS, MAX_SEED, int_in
from ..machinery import config
from ..errors import GluonMultiGPUError, flag


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

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self.values_joined(args), namespace)

    def values_joined(self, args):
        """``args`` with each ``--flag -x`` as ``--flag=-x`` where ``--flag`` takes one value and
        ``-x`` is no flag of this parser: argparse took such a value (``--profile -1:3``) for a
        flag and said only 'expected one argument'; the flag's own check now names the value.
        Up to the first positional argument or ``--`` (a launched command's own flags after)."""
        flags, joined, rest = self._option_string_actions, [], iter(args)
        for token in rest:
            if token == '--' or not token.startswith('-'):
                return [*joined, token, *rest]
            # the next token, for a flag of this parser that takes one value
            value = next(rest, None) if getattr(flags.get(token), 'nargs', 0) is None else None
            if value is not None and value.startswith('-') and value != '--' and \
                    value.split('=')[0] not in flags:
                joined.append(f'{token}={value}')
            else:
                joined += [token] if value is None else [token, value]
        return joined


#: A seed of the initial weights and the data order.
seed = int_in(0, MAX_SEED)


def add_device_flags(p, gpu_help, cpu_help):
    """Add the mutually exclusive ``--num-gpus``/``--cpu-devices`` pair to parser ``p``."""
    where = p.add_mutually_exclusive_group()
    where.add_argument('--num-gpus', type=int_in(1, MAX_GPUS), metavar='N', help=gpu_help)
    where.add_argument('--cpu-devices', type=int_in(1, MAX_CPU_DEVICES), metavar='N', help=cpu_help)


class _QuietParser(OneLineParser):
    """A parser that raises ``UsageError`` instead of printing and exiting (no abbreviations)."""

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
    if args.cpu_devices is not None or args.num_gpus is not None:  # (the group allows one)
        return args.cpu_devices or 0  # --num-gpus: no CPU context
    # Neither flag: all GPUs, or one CPU context when there are none (no NVIDIA
    # device node: MXNet would find no GPU either).
    return None if os.path.exists('/dev/nvidiactl') else 1


def add_config_flags(p, config_class, exclusive=()):
    """Add a flag for each field of ``config_class`` (``config.RunConfig``) to parser ``p``,
    in argument groups by the fields' ``group``; the fields named in ``exclusive`` exclude
    each other. The flag of ``batch_size`` is ``--batch-size``; its help, type and choices
    are the field's."""
    groups = {name: p.add_argument_group(name) for name in config.GROUPS}
    either = {}
    own = list(vars(config_class).get('__annotations__', {}))  # a subclass's own fields first
    for f in sorted((f for f in dataclasses.fields(config_class) if 'group' in f.metadata),
                    key=lambda f: own.index(f.name) if f.name in own else len(own)):
        meta = f.metadata
        where = groups[meta['group']]
        if f.name in exclusive:
            where = either.setdefault(meta['group'], where.add_mutually_exclusive_group())
        shown = f.default if not isinstance(f.default, tuple) else ' '.join(f.default)
        text = meta['help'] + ('' if shown in (None, False) or 'default:' in meta['help']
                               else f' (default: {shown})')
        text = GluonMultiGPUError(text).describe(flag)  # `lr`: --lr
        options = dict(dest=f.name, help=text.replace('%', '%%'))
        if f.default is False:
            options['action'] = 'store_true'
        else:
            options.update(default=list(f.default) if isinstance(f.default, tuple) else f.default,
                           type=meta['parse'], metavar=meta['metavar'], choices=meta['choices'],
                           nargs=meta['nargs'])
            options = {k: v for k, v in options.items() if v is not None or k == 'default'}
        where.add_argument(flag(f.name), **options)


def error_line(error):
    """The one line printed for a ``GluonMultiGPUError``: its message with the CLI's flag names."""
    return f'error: {error.describe(flag)}'

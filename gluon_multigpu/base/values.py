"""The checks of one setting's value: a value given in Python (``check_*``, raising the
package's one-line ``GluonMultiGPUError``) or a command line's text (``int_in`` and the
other argparse types, raising argparse's error). ``config``'s fields name them.

Nothing here loads MXNet, nor NumPy: every program imports this module before it can say
in one line that NumPy or MXNet does not load (``cli.console.command``).
"""
import argparse
import importlib.util
import math
import numbers
import os
import shlex
import struct
import sys

from ..errors import GluonMultiGPUError

__all__ = ['MODEL_NAMES', 'DATASETS', 'DATASET_NAMES', 'KVSTORES', 'DIST_KVSTORES', 'DTYPES',
           'SCHEDULES', 'MAX_SEED', 'MAX_ACCUMULATE', 'MAX_IN_FLIGHT', 'MAX_CPU_DEVICES',
           'MAX_GPUS', 'LR_MAX', 'NO_DIST_CLIP', 'check_epochs', 'check_seed', 'check_lr',
           'check_accumulate', 'check_clip', 'check_warmup', 'whole', 'seconds',
           'one_of', 'known', 'path', 'switch', 'kvstores', 'split', 'int_in', 'positive_float',
           'non_negative_float', 'path_of', 'split_weights', 'event_files', 'tensorboardx_missing']

#: The networks, data sets, kvstores and compute types a run can name (the package's
#: registries, ``model.MODELS`` and the others, hold these names).
MODEL_NAMES = ('resnet18', 'simple-cnn')
#: The data sets: their images (train, test), the shape of one and the classes.
DATASETS = {'fashion-mnist': {'train': 60000, 'test': 10000, 'shape': (28, 28), 'classes': 10},
            'mnist': {'train': 60000, 'test': 10000, 'shape': (28, 28), 'classes': 10}}
DATASET_NAMES = tuple(DATASETS)
KVSTORES = ('local', 'device', 'nccl', 'none')
DIST_KVSTORES = ('dist_sync', 'dist_device_sync', 'dist_async')
DTYPES = ('float32', 'float16', 'bfloat16')
#: The shapes of a learning-rate schedule (``schedule.Schedule``).
SCHEDULES = ('constant', 'step', 'cosine', 'onecycle')
#: The largest seed: MXNet's and NumPy's generators take 32 bits.
MAX_SEED = 2**32 - 1
#: The largest number of batches summed into one update.
MAX_ACCUMULATE = 10**4
#: Steps MXNet may run behind Python by default: Ctrl-C and progress act within a step.
MAX_IN_FLIGHT = 1
#: Most CPU contexts (one engine thread each) and GPUs a run takes.
MAX_CPU_DEVICES = MAX_GPUS = 64
#: The largest learning rate float32 holds: MXNet's optimizer keeps it in float32.
LR_MAX = struct.unpack('<f', b'\xff\xff\x7f\x7f')[0]

#: Why a parameter server cannot clip (``clip_grad_norm`` with a ``dist_*`` kvstore).
NO_DIST_CLIP = ('`clip_grad_norm` needs the summed gradient before the update, and a parameter '
                "server's servers update each parameter on its own as its gradients arrive; "
                'train on one machine to clip')

#: What a `split` that is neither a name nor weights is, and what to give.
_NOT_WEIGHTS = ('is neither even, auto nor positive weights; give even, auto or one weight per '
                'device, e.g. 1,3')

# -- checks of values given in Python ---------------------------------------------------------

def _boolean(value):
    """Whether ``value`` is Python's or NumPy's bool (NumPy is loaded where one of its exists)."""
    return isinstance(value, (bool, getattr(sys.modules.get('numpy'), 'bool_', bool)))


def _integer(value):
    return isinstance(value, numbers.Integral) and not _boolean(value)


def _real(value):
    return isinstance(value, numbers.Real) and not _boolean(value)


def check_lr(lr):
    """Return ``lr`` as a ``float``; raise unless a positive number float32 holds (not 0)."""
    value = float(lr) if _real(lr) else math.nan
    # a NaN or an infinity fails the range; rounded to float32, as MXNet's optimizer keeps a
    # learning rate, it must not be 0
    if not (0 < value <= LR_MAX and struct.unpack('<f', struct.pack('<f', value))[0] > 0):
        raise GluonMultiGPUError(f'learning rate must be a positive number within float32\'s '
                                 f'range (at most {LR_MAX:.4g}), got {lr!r}')
    return value


def check_clip(clip, name=None):  # pylint: disable=unused-argument  (a field's check)
    """Return ``clip`` as a ``float`` (None: no clipping); raise unless positive and finite."""
    if clip is not None and not (_real(clip) and math.isfinite(clip) and float(clip) > 0):
        raise GluonMultiGPUError(f'`clip_grad_norm` must be a positive number (the largest '
                                 f'global gradient norm an update uses), got {clip!r}')
    return None if clip is None else float(clip)


def whole(low, high, message='`{name}` must be a whole number {low} to {high}, got {value!r}',
          optional=True):
    """A check of a whole number from ``low`` to ``high`` (None passes where ``optional``):
    ``check(value, name)``, whose error is ``message`` (``str.format`` of these names)."""
    def check(value, name=None):
        if (value is not None or not optional) and not (_integer(value) and low <= value <= high):
            raise GluonMultiGPUError(message.format(name=name, low=low, high=high, value=value))
        return None if value is None else int(value)
    return check


#: ``check_*(value)``: ``value`` as an ``int``, or the one-line error: the number of epochs (a
#: positive integer), the seed (0 to ``MAX_SEED``; None: not seeded), the batches summed into
#: one update (1 to ``MAX_ACCUMULATE``), the warm-up's updates (0 to 10**8).
check_epochs = whole(1, math.inf, 'number of epochs must be a positive integer, got {value!r}',
                     optional=False)
check_seed = whole(0, MAX_SEED, 'seed must be a whole number 0 to {high} (or None: not seeded), '
                   'got {value!r}')
check_accumulate = whole(1, MAX_ACCUMULATE, '`accumulate` must be a whole number 1 to {high} (the '
                         'batches summed into one update), got {value!r}', optional=False)
check_warmup = whole(0, 10**8, '`warmup_steps` must be a whole number 0 or more (the updates whose '
                     'rate rises to the learning rate), got {value!r}', optional=False)


def seconds(value, name):
    if value is not None and not (_real(value) and math.isfinite(value) and 0 <= value <= 1e6):

        raise GluonMultiGPUError(f'`{name}` must be a number of seconds from 0 to 1e6, '
                                 f'got {value!r}')
    return None if value is None else float(value)


def one_of(choices):
    def check(value, name):
        if value not in choices:
            raise GluonMultiGPUError(f'`{name}` {value!r} is not one of {", ".join(choices)}; '
                                     'give one of them')
        return value
    return check


def known(value, choices, what, error=GluonMultiGPUError):
    """Raise ``error`` unless ``value`` is one of ``choices`` (the names of a registry: an
    unknown ``what``, "dtype" or "model", and the names to choose from)."""
    if value not in choices:
        raise error(f'unknown {what} {value!r}; choose one of {", ".join(choices)}')


def path(value, name):
    if value is not None and (not isinstance(value, (str, os.PathLike))
                              or not str(os.fspath(value)).strip()):
        raise GluonMultiGPUError(f'`{name}` {value!r} is not a path; give a file or folder name')
    return value


def event_files(value, name):
    """Check of `tensorboard`: a path, and tensorboardX there to write the event files (looked
    for, not imported: the command line says so before MXNet loads)."""
    value = path(value, name)
    if value is not None and importlib.util.find_spec('tensorboardX') is None:
        raise GluonMultiGPUError(tensorboardx_missing(name))
    return value


def tensorboardx_missing(name='tensorboard'):
    """The line saying that `name` needs tensorboardX, and the install that keeps NumPy."""
    # (the package's extra would install mxnet's own requirements again: NumPy 1 over NumPy 2)
    python = shlex.quote(sys.executable) if sys.executable else 'python'
    return (f'`{name}` needs the tensorboardX package, which is not installed in this '
            f'environment: {python} -m pip install tensorboardX (it leaves NumPy as it is)')


def switch(value, name):
    if not _boolean(value):
        raise GluonMultiGPUError(f'`{name}` must be True or False, got {value!r}')
    return bool(value)


def kvstores(value, name):
    if not (names := (value,) if isinstance(value, str) else tuple(value or ())):
        raise GluonMultiGPUError(f'`{name}` is empty; give one or more of '
                                 f'{", ".join(KVSTORES + DIST_KVSTORES)}')
    for kvstore in names:
        one_of(KVSTORES + DIST_KVSTORES)(kvstore, name)
    return tuple(dict.fromkeys(names))


def split(value, name):
    if value in (None, 'auto', 'even'):
        return None if value == 'even' else value
    weights = list(value) if isinstance(value, (list, tuple)) else []
    if not weights or not all(_real(w) and math.isfinite(w) and 0 < w <= 1e6 for w in weights):
        raise GluonMultiGPUError(f'`{name}` {value!r} {_NOT_WEIGHTS}')
    return [float(w) for w in weights]


# -- the command line's types: a text to a value, or one line saying what to give --------------

def _number(text, kind, low, high, wanted, above_low=False):
    """Parse ``text`` as ``kind`` in ``[low, high]`` (``(low, high]`` with ``above_low``)."""
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
    return lambda text: _number(text, int, low, high, f'a whole number from {low} to {high}')


def positive_float(text):
    """argparse type: a number greater than 0, at most 1e6."""
    return _number(text, float, 0, 1e6, 'a number greater than 0 and at most 1e6', True)


def non_negative_float(text):
    """argparse type: a number from 0 to 1e6."""
    return _number(text, float, 0, 1e6, 'a number from 0 to 1e6')


def path_of(kind):
    """argparse type: a path that is not empty; ``kind`` says what to give ("a directory")."""
    def parse(text):
        if not text.strip():
            raise argparse.ArgumentTypeError(f'{text!r} is an empty path; give {kind}')
        return text
    return parse


def split_weights(text):
    """argparse type of `split`: ``even`` (None), ``auto``, or positive weights ``W1,W2,...``."""
    if text in ('even', 'auto'):
        return split(text, 'split')
    try:
        return split([float(w) for w in text.split(',')], 'split')
    except (ValueError, GluonMultiGPUError):
        raise argparse.ArgumentTypeError(f'{text!r} {_NOT_WEIGHTS}') from None

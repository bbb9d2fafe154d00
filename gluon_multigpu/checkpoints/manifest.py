"""The manifest of a checkpoint: what it must hold, checked field by field before it is trusted.

A manifest is read within a size cap, as JSON without NaN or infinities and
nested no deeper than it is written; every number must lie in its range, so
that nothing a hand edit puts there reaches the arithmetic of a run.
"""
import json
import math

from ..errors import CheckpointError

__all__ = ['FORMAT', 'MAX_MANIFEST_BYTES', 'read_manifest', 'validate_manifest']

#: Version 2: the optimizer state is an array file (``states``); version 1 pickled it.
FORMAT = 'gluon-multigpu-checkpoint-2'
_PICKLED = 'gluon-multigpu-checkpoint-1'
#: A manifest is a few hundred bytes an epoch: 32 MiB holds over 100,000 epochs.
MAX_MANIFEST_BYTES = 32 << 20
#: The largest checkpoint number (``ckpt-NNNNNN``); names start again at 1 after it.
MAX_SEQUENCE = 999999


def _no_constant(name):
    raise ValueError(f'{name} is not a number a manifest holds')


def read_manifest(stream):
    """Parse a manifest from the binary ``stream``; raise ``CheckpointError`` saying why not."""
    data = stream.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f'it is larger than {MAX_MANIFEST_BYTES >> 20} MiB, far more than '
                              'a manifest holds')
    try:
        return json.loads(data.decode('utf-8'), parse_constant=_no_constant)
    except RecursionError:
        raise CheckpointError('it is nested deeper than any manifest') from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(str(e)) from None


def _is(value, kind, low=None):
    ok = isinstance(value, kind) and (kind is bool) == isinstance(value, bool)  # True is no int
    return ok and (low is None or value >= low)


def _check_record(record, types, where, lists=()):
    """Raise ``CheckpointError`` unless ``record`` is a dict with ``types`` (name -> kind, range)
    and, where present, the fields ``lists``: lists of finite numbers 0 or more.

    A range is ``(low, high, low_included)``; None leaves a side open.
    """
    fields = {k: v for k, v in record.items() if k not in lists} if isinstance(record, dict) \
        else record
    if not isinstance(fields, dict) or set(fields) != set(types):
        raise CheckpointError(f'{where} must have exactly the fields {", ".join(types)}')
    for name, (kind, low, high, closed) in types.items():
        value = fields[name]
        if value is None and name in ('train_loss', 'train_acc', 'test_acc'):
            continue
        if not (_is(value, kind) or (kind is float and _is(value, int))):
            raise CheckpointError(f'{where}: field {name} is {value!r}, not a {kind.__name__}')
        if kind is bool:
            continue
        if (kind is float and not math.isfinite(value)) or (high is not None and value > high) or (
                low is not None and (value < low or (value == low and not closed))):
            bound = (f'{"above" if not closed else "at least"} {low:g}' if high is None else
                     f'from {low:g} to {high:g}')
            raise CheckpointError(f'{where}: field {name} is {value!r}, and it must be {bound}')
    for name in (n for n in lists if n in record):
        values = record[name]
        if not (isinstance(values, list) and all(
                (_is(v, float) or _is(v, int)) and math.isfinite(v) and v >= 0 for v in values)):
            raise CheckpointError(f'{where}: field {name} must be a list of numbers 0 or more')


_WHOLE, _NONNEG, _POSITIVE, _SHARE = ((int, 1, None, True), (float, 0, None, True),
                                      (float, 0, None, False), (float, 0, 1, True))
_PARTIAL_TYPES = {'loss_sum': _NONNEG, 'num_correct': _NONNEG, 'samples': _WHOLE,
                  'seconds': _POSITIVE, 'batches': _WHOLE, 'stopped': (bool, None, None, True)}
_RECORD_TYPES = {'epoch': _WHOLE, 'train_loss': _NONNEG, 'train_acc': _SHARE, 'test_acc': _SHARE,
                 'seconds': _POSITIVE, 'eval_seconds': _NONNEG, 'samples': _WHOLE}


#: Fields of an epoch's record that only some runs write (``results.OPTIONAL_FIELDS``): lists
#: of finite numbers (the rate of each update, each update's gradient norm).
_OPTIONAL = ('rates', 'grad_norms')


def validate_manifest(manifest):
    """Raise ``CheckpointError`` naming the first field of ``manifest`` that is missing or wrong."""
    if isinstance(manifest, dict) and manifest.get('format') == _PICKLED:
        raise CheckpointError('it was written by an earlier gluon-multigpu, whose optimizer '
                              'state is a Python pickle, which could run code when loaded; this '
                              'version does not load it: start a fresh run')
    if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
        raise CheckpointError(f'it is not a gluon-multigpu checkpoint manifest ({FORMAT})')
    for key in ('sequence', 'epoch', 'partial', 'history', 'config', 'files'):
        if key not in manifest:
            raise CheckpointError(f'its field {key} is missing')
    if not _is(manifest['sequence'], int, 1) or not _is(manifest['epoch'], int, 0) or \
            manifest['sequence'] > MAX_SEQUENCE or manifest['epoch'] > 10**7:
        raise CheckpointError(f'its fields sequence (1 to {MAX_SEQUENCE}) and epoch (0 or more) '
                              'must be whole numbers in range')
    if (partial := manifest['partial']) is not None:
        _check_record(partial, _PARTIAL_TYPES, 'its field partial', ('grad_norms',))
        if partial['samples'] < partial['batches'] or partial['num_correct'] > partial['samples']:
            raise CheckpointError('its field partial counts fewer samples than batches or more '
                                  'correct answers than samples')
    if not isinstance(manifest['history'], list) or len(manifest['history']) != manifest['epoch']:
        raise CheckpointError(f'its field history must list {manifest["epoch"]} epoch(s)')
    for i, record in enumerate(manifest['history'], 1):
        _check_record(record, _RECORD_TYPES, f'its field history[{i - 1}]', _OPTIONAL)
        if record['epoch'] != i:
            raise CheckpointError(f'its field history[{i - 1}].epoch must be {i}')
    if not isinstance(manifest['config'], dict):
        raise CheckpointError('its field config must be an object')
    files = manifest['files']
    if not isinstance(files, dict) or set(files) != {'params', 'states'}:
        raise CheckpointError('its field files must name exactly params and states')
    for role, entry in files.items():
        _check_record(entry, {'name': (str, None, None, True), 'bytes': (int, 0, None, True),
                              'sha256': (str, None, None, True)}, f'its field files.{role}')
        if entry['name'] != f'ckpt-{manifest["sequence"]:06d}.{role}':
            raise CheckpointError(f'its field files.{role}.name {entry["name"]!r} is not ckpt-'
                                  f'{manifest["sequence"]:06d}.{role}, the name of its {role} file')
        if len(entry['sha256']) != 64:  # its size is checked above: a whole number, 0 or more
            raise CheckpointError(f'its field files.{role} does not give a size and a SHA-256')

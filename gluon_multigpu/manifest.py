"""The manifest of a checkpoint: what it must hold, checked field by field before it is trusted."""
import re

from .errors import CheckpointError

__all__ = ['FORMAT', 'validate_manifest']

FORMAT = 'gluon-multigpu-checkpoint-1'
_FILE_NAME = re.compile(r'ckpt-\d{6}\.(params|states)')


def _is(value, kind, low=None):
    ok = isinstance(value, kind) and not isinstance(value, bool) if kind is not bool \
        else isinstance(value, bool)
    return ok and (low is None or value >= low)


def _check_record(fields, types, where):
    """Raise ``CheckpointError`` unless ``fields`` is a dict with ``types`` (name -> kind)."""
    if not isinstance(fields, dict) or set(fields) != set(types):
        raise CheckpointError(f'{where} must have exactly the fields {", ".join(types)}')
    for name, kind in types.items():
        value = fields[name]
        if not (value is None and name in ('train_loss', 'train_acc', 'test_acc')) and not (
                _is(value, kind) or (kind is float and _is(value, int))):
            raise CheckpointError(f'{where}: field {name} is {value!r}, not a {kind.__name__}')


_PARTIAL_TYPES = {'loss_sum': float, 'num_correct': float, 'samples': int, 'seconds': float,
                  'batches': int, 'stopped': bool}
_RECORD_TYPES = {'epoch': int, 'train_loss': float, 'train_acc': float, 'test_acc': float,
                 'seconds': float, 'eval_seconds': float, 'samples': int}


def validate_manifest(manifest):
    """Raise ``CheckpointError`` naming the first field of ``manifest`` that is missing or wrong."""
    if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
        raise CheckpointError(f'it is not a gluon-multigpu checkpoint manifest ({FORMAT})')
    for key in ('sequence', 'epoch', 'partial', 'history', 'config', 'files'):
        if key not in manifest:
            raise CheckpointError(f'its field {key} is missing')
    if not _is(manifest['sequence'], int, 0) or not _is(manifest['epoch'], int, 0):
        raise CheckpointError('its fields sequence and epoch must be whole numbers of 0 or more')
    if manifest['partial'] is not None:
        _check_record(manifest['partial'], _PARTIAL_TYPES, 'its field partial')
        if manifest['partial']['batches'] < 1:
            raise CheckpointError('its field partial.batches must be at least 1')
    if not isinstance(manifest['history'], list) or len(manifest['history']) != manifest['epoch']:
        raise CheckpointError(f'its field history must list {manifest["epoch"]} epoch(s)')
    for i, record in enumerate(manifest['history'], 1):
        _check_record(record, _RECORD_TYPES, f'its field history[{i - 1}]')
        if record['epoch'] != i:
            raise CheckpointError(f'its field history[{i - 1}].epoch must be {i}')
    if not isinstance(manifest['config'], dict):
        raise CheckpointError('its field config must be an object')
    files = manifest['files']
    if not isinstance(files, dict) or set(files) != {'params', 'states'}:
        raise CheckpointError('its field files must name exactly params and states')
    for role, entry in files.items():
        _check_record(entry, {'name': str, 'bytes': int, 'sha256': str}, f'its field files.{role}')
        if not _FILE_NAME.fullmatch(entry['name']):
            raise CheckpointError(f'its field files.{role}.name {entry["name"]!r} is not a '
                                  'checkpoint file name')

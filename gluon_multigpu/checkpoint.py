"""Checkpoints that survive a crash at any moment, and stopping on a signal.

A checkpoint directory holds at most one complete checkpoint, described by
``manifest.json``: the parameters (``save_parameters``), the Trainer's
optimizer state (``save_states``), the epochs done, the batches done in the
next epoch when it was stopped part-way (with that part's running totals),
the data order's seed, the history so far, and the settings of the run.

Every file goes through a temporary file that is flushed, fsynced and
renamed, and the manifest is written last and names its files by content
hash: until the new manifest has been renamed into place, the old one still
describes files that are all still there (old files are removed only
afterwards). A crash, SIGKILL or full disk at any moment therefore leaves
the last complete checkpoint intact.
"""
import datetime
import hashlib
import json
import os
import signal

from .errors import CheckpointError
from .reporting import atomic_write, check_output_dir

__all__ = ['Checkpointer', 'CheckpointState', 'StopRequest', 'MANIFEST', 'FORMAT']

MANIFEST = 'manifest.json'
FORMAT = 'gluon-multigpu-checkpoint-1'


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _fsync_file(path):
    with open(path, 'rb+') as f:
        os.fsync(f.fileno())


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointState:
    """A loaded checkpoint: what ``training.fit`` needs to continue a run.

    Attributes
    ----------
    epoch : int
        Epochs completed.
    partial : EpochTotals or None
        When stopped inside epoch ``epoch + 1``: its batches done and running totals.
    history : list of EpochRecord
    manifest : dict
        The manifest as read.
    """

    def __init__(self, directory, manifest):
        from .training import EpochRecord, EpochTotals
        self.directory, self.manifest = directory, manifest
        self.epoch = manifest['epoch']
        self.partial = EpochTotals(**manifest['partial']) if manifest['partial'] else None
        self.history = [EpochRecord(**e) for e in manifest['history']]

    def restore(self, net, trainer, devices):
        """Load the parameters onto every device of ``devices``, then the Trainer's state.

        The parameters go first: a kvstore that updates on the store copies
        the weights when the Trainer first touches it.
        """
        files = self.manifest['files']
        net.load_parameters(os.path.join(self.directory, files['params']['name']), ctx=devices)
        trainer.load_states(os.path.join(self.directory, files['states']['name']))


class Checkpointer:
    """Write and read the checkpoints of one run in ``directory``.

    Parameters
    ----------
    directory : str
        Created if missing (its parent must exist).
    config : dict
        The settings that must match for a checkpoint to be resumed (model,
        data, batch size, learning rate, seed, ...); JSON-serialisable.
    """

    def __init__(self, directory, config):
        self.directory = os.path.abspath(directory)
        self.config = dict(config)
        self._sequence = 0
        self._loaded = None  # (manifest stat, state): the checks and hashes are done once

    @property
    def manifest_path(self):
        return os.path.join(self.directory, MANIFEST)

    def exists(self):
        """Whether the directory holds a manifest (complete or not)."""
        return os.path.isfile(self.manifest_path)

    def describe(self):
        """A few words on the checkpoint in the directory, for messages."""
        try:
            manifest = self._read_manifest()
        except CheckpointError:
            return f'damaged, in {self.directory}'
        where = f'epoch {manifest["epoch"]}'
        if manifest['partial']:
            where = (f'{manifest["partial"]["batches"]} batch(es) into epoch '
                     f'{manifest["epoch"] + 1}')
        return f'{where}, in {self.directory}'

    def check_directory(self, resume, num_epochs=None):
        """Raise ``CheckpointError`` unless this run may write (and, with ``resume``, read) here.

        Without ``resume`` a directory that already holds a checkpoint is
        refused, so that a new run never overwrites an old one; with it, the
        checkpoint must be intact, of a run with the same settings, and not
        past ``num_epochs``.
        """
        check_output_dir(self.directory, '--checkpoint-dir')
        if not self.exists():
            return
        if not resume:
            raise CheckpointError(f'{self.directory} already holds a checkpoint '
                                  f'({self.describe()}); add --resume to continue it, or give '
                                  'another --checkpoint-dir')
        state = self.load()  # refuses a damaged checkpoint or one of another run
        if num_epochs is not None:
            self.check_epochs(state, num_epochs)

    def check_epochs(self, state, num_epochs):
        """Raise ``CheckpointError`` if ``state`` has more epochs done than ``num_epochs``."""
        if state.epoch > num_epochs:
            raise CheckpointError(f'the checkpoint in {self.directory} has {state.epoch} epochs '
                                  f'done, more than the {num_epochs} asked for; ask for '
                                  f'--num-epochs {state.epoch} or more')

    def _read_manifest(self):
        try:
            with open(self.manifest_path) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointError(f'the checkpoint in {self.directory} is damaged (cannot read '
                                  f'{MANIFEST}: {e}); remove it or give another '
                                  '--checkpoint-dir') from None
        keys = {'format', 'epoch', 'partial', 'history', 'config', 'files'}
        if not isinstance(manifest, dict) or manifest.get('format') != FORMAT or \
                not keys <= set(manifest):
            raise CheckpointError(f'{self.manifest_path} is not a gluon-multigpu checkpoint '
                                  f'manifest ({FORMAT}); remove it or give another '
                                  '--checkpoint-dir')
        return manifest

    def load(self):
        """Return the ``CheckpointState`` in the directory, or None if it holds none.

        Raises ``CheckpointError`` for a damaged checkpoint (a file missing,
        or not what the manifest's hash says) or one of a run with other settings.
        """
        if not self.exists():
            return None
        stat = os.stat(self.manifest_path)
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._loaded is not None and self._loaded[0] == stamp:
            return self._loaded[1]
        manifest = self._read_manifest()
        for role, entry in manifest['files'].items():
            path = os.path.join(self.directory, entry['name'])
            if not os.path.isfile(path):
                raise CheckpointError(f'the checkpoint in {self.directory} is damaged: its {role} '
                                      f'file {entry["name"]} is missing; remove the directory '
                                      'or give another --checkpoint-dir')
            if os.path.getsize(path) != entry['bytes'] or _sha256(path) != entry['sha256']:
                raise CheckpointError(f'the checkpoint in {self.directory} is damaged: '
                                      f'{entry["name"]} does not match its recorded hash; '
                                      'remove the directory or give another --checkpoint-dir')
        differ = [f'{k} {manifest["config"].get(k)!r} (now {v!r})'
                  for k, v in self.config.items() if manifest['config'].get(k) != v]
        if differ:
            raise CheckpointError(f'the checkpoint in {self.directory} is of another run: '
                                  f'{", ".join(differ)}; use the same settings or another '
                                  '--checkpoint-dir')
        self._sequence = manifest.get('sequence', 0)
        state = CheckpointState(self.directory, manifest)
        self._loaded = (stamp, state)
        return state

    def _write_durably(self, name, write):
        """Write a file through ``write(tmp_path)``, fsync and rename it; return its entry."""
        path = os.path.join(self.directory, name)
        tmp = f'{path}.tmp'
        try:
            write(tmp)
            _fsync_file(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return {'name': name, 'bytes': os.path.getsize(path), 'sha256': _sha256(path)}

    def save(self, net, trainer, history, epoch, partial=None):
        """Write a complete checkpoint after ``epoch`` epochs (and ``partial`` of the next)."""
        os.makedirs(self.directory, exist_ok=True)
        old = set(os.listdir(self.directory))
        self._sequence += 1
        stem = f'ckpt-{self._sequence:06d}'
        files = {'params': self._write_durably(f'{stem}.params', net.save_parameters),
                 'states': self._write_durably(f'{stem}.states', trainer.save_states)}
        manifest = {
            'format': FORMAT, 'sequence': self._sequence,
            'written': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'epoch': epoch, 'partial': partial._asdict() if partial is not None else None,
            'history': [vars(r) for r in history], 'config': self.config, 'files': files,
            'data_order': {'seed': self.config.get('seed'), 'next_epoch': epoch},
        }
        with atomic_write(self.manifest_path) as f:
            json.dump(manifest, f, indent=2)
            f.write('\n')
        _fsync_dir(self.directory)
        keep = {MANIFEST} | {entry['name'] for entry in files.values()}
        for name in old - keep:  # earlier checkpoints, and leftovers of a killed save
            if name.startswith(('ckpt-', f'.{MANIFEST}.')):
                os.remove(os.path.join(self.directory, name))


class StopRequest:
    """A flag that SIGINT and SIGTERM set, asked by the training loop after every step.

    A second signal while the first is being handled stops at once
    (``KeyboardInterrupt``), without a checkpoint. Use as a context manager:
    the previous handlers come back on exit.

    Attributes
    ----------
    signum : int or None
        The first signal received.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._previous = {}

    def __call__(self):
        return self.signum is not None

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self):
        for s in self.SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False

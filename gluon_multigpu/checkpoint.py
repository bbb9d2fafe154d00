"""Checkpoints that survive a crash at any moment: a hook of ``train`` that saves and resumes.

A checkpoint directory holds at most one complete checkpoint, described by
``manifest.json``: the parameters (``save_parameters``), the Trainer's
optimizer state (``save_states``), the epochs done, the batches done in the
next epoch when it was stopped part-way (with that part's running totals),
the data order's seed, the history so far, and the settings of the run.

Every file goes through a temporary file that is flushed, fsynced and
renamed, and the manifest is written last and names its files by content
hash: until the new manifest has been renamed into place, the old one still
describes files that are all still there. A crash, SIGKILL or full disk at
any moment therefore leaves the last complete checkpoint intact.

The directory may hold the user's own files: a save removes only the files
of the checkpoint it replaces (named in the old manifest) and leftovers of a
killed save, which carry the checkpoint's exact names (``ckpt-NNNNNN.params``,
``ckpt-NNNNNN.states``, with ``.tmp``; ``.manifest.json.*.tmp``). A lock
(``flock`` on ``.lock``) held while a run uses the directory refuses a second
run; the operating system drops it when the process ends, however it ends, so
a ``.lock`` left by a killed run is simply taken over.
"""
import datetime
import errno
import fcntl
import hashlib
import json
import os
import re

import mxnet as mx

from .errors import CheckpointError
from .files import atomic_write, check_output_dir
from .manifest import FORMAT, validate_manifest
from .results import EpochRecord, EpochTotals
from .training import Hook

__all__ = ['Checkpointer', 'CheckpointReader', 'CheckpointState', 'MANIFEST', 'FORMAT']

MANIFEST = 'manifest.json'
LOCK = '.lock'
_OWNED = re.compile(r'ckpt-\d{6}\.(params|states)(\.tmp)?|\.manifest\.json\.[A-Za-z0-9_]+\.tmp')


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path, flags=os.O_RDONLY):
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _states_writer(trainer):
    """How to write ``trainer``'s optimizer state to a path.

    A parameter server keeps the optimizer on its servers, where a worker
    cannot save it; the package's plain SGD has no state to keep, so such a
    checkpoint holds an empty states file (and resuming loads none).
    """
    if getattr(trainer, '_distributed', False) and getattr(trainer, '_update_on_kvstore', False):
        if trainer._optimizer.__class__.__name__ != 'SGD' or \
                getattr(trainer._optimizer, 'momentum', 0):
            raise CheckpointError('a parameter server keeps this optimizer\'s state on its '
                                  'servers, where a checkpoint cannot reach it')
        return lambda path: open(path, 'wb').close()
    return trainer.save_states


class CheckpointState:
    """A loaded checkpoint: what ``train`` needs to continue a run.

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
        if files['states']['bytes']:  # empty: the servers of a parameter server held it
            trainer.load_states(os.path.join(self.directory, files['states']['name']))


class Checkpointer(Hook):
    """Save a run after every epoch and when it is stopped; resume it (a ``train`` hook).

    Parameters
    ----------
    directory : str
        Created if missing (its parent must exist).
    config : dict
        The settings that must match for a checkpoint to be resumed (model,
        data, batch size, learning rate, seed, ...); JSON-serialisable.
    resume : bool
        Continue from the checkpoint in ``directory``, if it holds one.
    """

    def __init__(self, directory, config, resume=False):
        self.directory = os.path.abspath(directory)
        self.config, self.resume = dict(config), resume
        self._sequence = 0
        self._loaded = None  # (manifest stat, state): the checks and hashes are done once
        self._lock, self._made = None, False

    @property
    def manifest_path(self):
        return os.path.join(self.directory, MANIFEST)

    def exists(self):
        """Whether the directory holds a manifest (complete or not)."""
        return os.path.isfile(self.manifest_path)

    def describe(self):
        """A few words on the checkpoint in the directory, for messages."""
        try:
            state = self.load(check_config=False)
        except CheckpointError:
            return f'damaged, in {self.directory}'
        where = f'epoch {state.epoch}'
        if state.partial:
            where = f'{state.partial.batches} batch(es) into epoch {state.epoch + 1}'
        return f'{where}, in {self.directory}'

    # -- the directory: checked, locked, released -----------------------------------------

    def check_directory(self, num_epochs=None, batches_per_epoch=None):
        """Raise ``CheckpointError`` unless this run may continue (or start) from what is here.

        Without ``resume`` a directory that already holds a checkpoint is
        refused, so that a new run never overwrites an old one; with it, the
        checkpoint must be intact, of a run with the same settings, not past
        ``num_epochs``, and stopped within an epoch of ``batches_per_epoch``.
        Call it holding the lock (inside ``with checkpointer:``).
        """
        if not self.exists():
            return
        if not self.resume:
            raise CheckpointError(f'{self.directory} already holds a checkpoint '
                                  f'({self.describe()}); add `resume=True` to continue it, or '
                                  'choose another `checkpoint_dir`')
        state = self.load()  # refuses a damaged checkpoint or one of another run
        if num_epochs is not None and state.epoch > num_epochs:
            raise CheckpointError(f'the checkpoint in {self.directory} has {state.epoch} epochs '
                                  f'done, more than the {num_epochs} asked for; ask for '
                                  f'`num_epochs` {state.epoch} or more')
        self._check_partial(state, batches_per_epoch)

    def _check_partial(self, state, batches_per_epoch):
        if state.partial is not None and batches_per_epoch is not None and \
                state.partial.batches >= batches_per_epoch:
            raise self._damaged(f'{MANIFEST}: its field partial.batches '
                                f'({state.partial.batches}) is past the end of an epoch of '
                                f'{batches_per_epoch} batches')

    def __enter__(self):
        """Check the path, create the directory if missing and lock it against a second run."""
        if os.path.islink(self.directory) and not os.path.exists(self.directory):
            raise CheckpointError(f'checkpoint directory {self.directory} is a symbolic link to '
                                  'nothing; remove the link or choose another `checkpoint_dir`')
        check_output_dir(self.directory, 'checkpoint directory')
        if not os.path.isdir(self.directory):
            os.mkdir(self.directory)
            self._made = True
        path = os.path.join(self.directory, LOCK)
        while self._lock is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise CheckpointError(f'another run is using the checkpoint directory '
                                          f'{self.directory}; wait for it to end or choose '
                                          'another `checkpoint_dir`') from None
                raise
            try:  # the lock counts only if the file is still the one under that name
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock = fd
            else:
                os.close(fd)
        return self

    def __exit__(self, *exc):
        """Unlock and remove the lock file; a directory made by this run, still empty, goes too."""
        if self._lock is not None:
            _remove(os.path.join(self.directory, LOCK))  # while still holding the lock
            os.close(self._lock)
            self._lock = None
        if self._made and not self.exists():
            try:
                os.rmdir(self.directory)
            except OSError:
                pass  # something was put there meanwhile: keep it
        return False

    # -- reading --------------------------------------------------------------------------

    def _damaged(self, why):
        return CheckpointError(f'the checkpoint in {self.directory} is damaged: {why}; remove '
                               'it or choose another `checkpoint_dir`')

    def _read_manifest(self):
        try:
            with open(self.manifest_path) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            raise self._damaged(f'cannot read {MANIFEST} ({e})') from None
        try:
            validate_manifest(manifest)
        except CheckpointError as e:
            raise self._damaged(f'{MANIFEST}: {e}') from None
        return manifest

    def load(self, check_config=True):
        """Return the ``CheckpointState`` in the directory, or None if it holds none.

        Raises ``CheckpointError`` for a damaged checkpoint (a bad manifest, a
        file missing or not what the manifest's hash says) or, with
        ``check_config``, one of a run with other settings.
        """
        if not self.exists():
            return None
        stat = os.stat(self.manifest_path)
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._loaded is None or self._loaded[0] != stamp:
            manifest = self._read_manifest()
            for role, entry in manifest['files'].items():
                path = os.path.join(self.directory, entry['name'])
                if not os.path.isfile(path):
                    raise self._damaged(f'its {role} file {entry["name"]} is missing')
                if os.path.getsize(path) != entry['bytes'] or _sha256(path) != entry['sha256']:
                    raise self._damaged(f'{entry["name"]} does not match its recorded hash')
            self._loaded = (stamp, CheckpointState(self.directory, manifest))
        state = self._loaded[1]
        if check_config:
            saved = state.manifest['config']
            # Settings that only some runs record (workers, sync_bn, dtype) count when absent too.
            differ = [f'{k} {saved.get(k)!r} (now {self.config.get(k)!r})'
                      for k in sorted(set(self.config) | set(saved))
                      if saved.get(k) != self.config.get(k)]
            if differ:
                raise CheckpointError(f'the checkpoint in {self.directory} is of another run: '
                                      f'{", ".join(differ)}; use the same settings or choose '
                                      'another `checkpoint_dir`')
        self._sequence = state.manifest['sequence']
        return state

    # -- writing --------------------------------------------------------------------------

    def _write_durably(self, name, write):
        """Write a file through ``write(tmp_path)``, fsync and rename it; return its entry."""
        path = os.path.join(self.directory, name)
        tmp = f'{path}.tmp'
        try:
            try:
                write(tmp)
            except mx.base.MXNetError as e:  # MXNet's file stream: no errno, say what it is
                raise OSError(errno.EIO, 'the write stopped short (disk full or file size limit?)',
                              tmp) from e
            _fsync(tmp)
            os.replace(tmp, path)
        finally:
            _remove(tmp)
        return {'name': name, 'bytes': os.path.getsize(path), 'sha256': _sha256(path)}

    def save(self, net, trainer, history, epoch, partial=None):
        """Write a complete checkpoint after ``epoch`` epochs (and ``partial`` of the next)."""
        os.makedirs(self.directory, exist_ok=True)
        try:
            replaced = {e['name'] for e in self._read_manifest()['files'].values()} \
                if self.exists() else set()
        except CheckpointError:
            replaced = set()
        self._sequence += 1
        stem = f'ckpt-{self._sequence:06d}'
        files = {'params': self._write_durably(f'{stem}.params', net.save_parameters),
                 'states': self._write_durably(f'{stem}.states', _states_writer(trainer))}
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
        _fsync(self.directory)
        keep = {entry['name'] for entry in files.values()}
        leftovers = {n for n in os.listdir(self.directory) if _OWNED.fullmatch(n)}
        for name in (replaced | leftovers) - keep:
            _remove(os.path.join(self.directory, name))

    # -- as a hook of train ----------------------------------------------------------------

    def begin(self, run):
        """With ``resume``: restore the parameters, the Trainer and the history; say where to go on."""
        state = self.load() if self.resume else None
        if state is None:
            return None
        self._check_partial(state, len(run.train_iter) if hasattr(run.train_iter, '__len__')
                            else None)
        state.restore(run.net, run.trainer, run.devices)
        run.result.epochs = list(state.history)
        run.train_iter.epoch = state.epoch  # replay the data order of the next epoch
        return state.epoch + 1, state.partial

    def stopped(self, run, totals):
        """Save the partial epoch."""
        self.save(run.net, run.trainer, run.result.epochs, run.epoch - 1, partial=totals)

    def epoch_end(self, run, record):
        """Save the epoch just done."""
        self.save(run.net, run.trainer, run.result.epochs, record.epoch)

    def diverged(self, run, error):
        """Say that the last good checkpoint is kept."""
        if self.exists():
            error.notes.append(f'the last good checkpoint ({self.describe()}) is kept')


class CheckpointReader(Checkpointer):
    """A ``Checkpointer`` that only resumes: for the workers of a parameter server but the first.

    It takes no lock and writes nothing; the first worker saves for all.
    """

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def save(self, net, trainer, history, epoch, partial=None):
        """Nothing: the first worker saves."""

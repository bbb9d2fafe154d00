"""A checkpoint directory's files: one complete checkpoint read and checked, or written so that
a crash at any moment leaves the last one intact (``CheckpointStore``, which the ``train`` hook
``checkpoint.Checkpointer`` extends).

A checkpoint directory holds at most one complete checkpoint, described by
``manifest.json``: the parameters (``save_parameters``), the Trainer's
optimizer state (``save_states``), the epochs done, the batches done in the
next epoch when it was stopped part-way (with that part's running totals),
the data order's seed, the history so far, and the settings of the run.
A save writes its files in a private folder (``savefolder``), fsyncs them,
renames them in, and renames the manifest, which names its files by content
hash, in last: until then the old manifest describes files still all there.
Nothing outside the directory is touched, nothing in it removed but what this
package owns, and the optimizer state is an array file (``states``), no pickle.
"""
import contextlib
import dataclasses
import datetime
import errno
import functools
import json
import os

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx

from ..errors import CheckpointError
from ..filesafety import atomic, fs, reading
from . import savefolder
from .manifest import FORMAT, MAX_SEQUENCE, read_manifest, validate_manifest
from .states import load_trainer_states, save_trainer_states
from ..machinery.config import PLAIN, RunConfig
from ..section.results import EpochRecord, EpochTotals

__all__ = ['CheckpointStore', 'CheckpointState', 'MANIFEST']

MANIFEST = 'manifest.json'

def _create_empty(path):
    os.close(fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))


def _states_writer(net, trainer):
    """How to write ``trainer``'s optimizer state to a path (``states.save_trainer_states``).

    A parameter server keeps the optimizer on its servers, where a worker
    cannot save it; the package's plain SGD has no state to keep, so such a
    checkpoint holds an empty states file (and resuming loads none).
    """
    if getattr(trainer, '_distributed', False) and getattr(trainer, '_update_on_kvstore', False):
        if trainer._optimizer.__class__.__name__ != 'SGD' or \
                getattr(trainer._optimizer, 'momentum', 0):
            raise CheckpointError('a parameter server keeps this optimizer\'s state on its '
                                  'servers, where a checkpoint cannot reach it')
        return _create_empty
    return functools.partial(save_trainer_states, net, trainer)  # MXNet's array file


def _settings(config):
    """``config`` with the updates it records as settings of their own."""
    flat = {k: v for k, v in config.items() if k != 'updates'}
    for key, value in (config.get('updates') or {}).items():
        flat['num_epochs' if key == 'schedule_epochs' else key] = value
    return flat


def _shown(value):
    return value if isinstance(value, str) else repr(value)


def config_differences(saved, now):
    """The settings in which a checkpoint's recorded ``saved`` config and ``now`` differ,
    each as ``name saved (now value)``, a setting of ``RunConfig`` named in backquotes (so a
    command line spells it as its flag). Settings that only some runs record (workers,
    sync_bn, dtype, updates) count when absent too."""
    saved, now = _settings(saved), _settings(now)
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return [f'{f"`{k}`" if k in names else k} {_shown(saved.get(k, PLAIN.get(k)))} '
            f'(now {_shown(now.get(k, PLAIN.get(k)))})'
            for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]


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
        self.directory, self.manifest, self.epoch = directory, manifest, manifest['epoch']
        partial = manifest['partial']
        self.partial = EpochTotals(**{**partial, 'grad_norms': tuple(partial.get(
            'grad_norms', ()))}) if partial else None
        self.history = [EpochRecord(**e) for e in manifest['history']]

    def restore(self, net, trainer, devices):
        """Load the parameters onto every device of ``devices``, then the Trainer's state.

        The parameters go first: a kvstore that updates on the store copies
        the weights when the Trainer first touches it.
        """
        files = self.manifest['files']
        params, states = (files[role]['name'] for role in ('params', 'states'))
        try:
            net.load_parameters(os.path.join(self.directory, params), ctx=devices)
        except (mx.base.MXNetError, AssertionError, ValueError, KeyError, IndexError) as e:
            why = '' if isinstance(e, mx.base.MXNetError) else f' ({str(e).strip()[:200]})'
            raise CheckpointStore._damaged(self, f'{params} does not load into this network{why}') \
                from None
        if files['states']['bytes']:  # empty: the servers of a parameter server held it
            try:
                load_trainer_states(net, trainer, os.path.join(self.directory, states))
            except CheckpointError as e:
                raise CheckpointStore._damaged(self, f'{states} is not an optimizer state of '
                                               f'this network: {e}') from None


class CheckpointStore:
    """The checkpoint in a directory: loaded and checked (``load``), or replaced by a new one
    (``save``); what killed saves left, removed (``_clean``).

    Parameters
    ----------
    directory : str
        Created by the first save if missing (its parent must exist).
    config : dict
        The settings of the run, recorded in each save and compared by ``load``.
    """

    def __init__(self, directory, config):
        self.directory, self.config = os.path.abspath(directory), dict(config)
        # ``_loaded``: (manifest stat, state), so that the checks and hashes are done once
        self._sequence, self._loaded = 0, None

    @property
    def manifest_path(self):
        return os.path.join(self.directory, MANIFEST)

    def exists(self):
        """Whether the directory holds a manifest (complete or not; or something in its place)."""
        return os.path.lexists(self.manifest_path)

    def describe(self):
        """A few words on the checkpoint in the directory, for messages."""
        with contextlib.suppress(CheckpointError):
            state = self.load(check_config=False)
            return (f'{state.partial.batches} batch(es) into epoch {state.epoch + 1}'
                    if state.partial else f'epoch {state.epoch}') + f', in {self.directory}'
        return f'damaged, in {self.directory}'

    # -- reading --------------------------------------------------------------------------

    def _damaged(self, why):  # also a CheckpointState's (its ``directory``)
        return CheckpointError(f'the checkpoint in {self.directory} is damaged: {why}; remove it '
                               'or choose another `checkpoint_dir`')

    def _read_manifest(self):
        try:
            with reading.open_file(self.manifest_path, follow_links=False) as f:
                manifest = read_manifest(f)
        except OSError as e:
            why = 'is a symbolic link' if os.path.islink(self.manifest_path) else \
                'is not a regular file' if os.path.lexists(self.manifest_path) and \
                not os.path.isfile(self.manifest_path) else f'cannot be read ({e.strerror})'
            raise self._damaged(f'{MANIFEST} {why}') from None
        except CheckpointError as e:
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
        info = os.lstat(self.manifest_path)
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if self._loaded is None or self._loaded[0] != stamp:
            manifest = self._read_manifest()
            for role, entry in manifest['files'].items():
                path = os.path.join(self.directory, entry['name'])
                if not os.path.lexists(path):
                    raise self._damaged(f'its {role} file {entry["name"]} is missing')
                if not savefolder.is_regular(path):
                    raise self._damaged(f'its {role} file {entry["name"]} is not a regular file '
                                        '(a link or a directory)')
                if os.path.getsize(path) != entry['bytes'] or \
                        savefolder.sha256(path) != entry['sha256']:
                    raise self._damaged(f'{entry["name"]} does not match its recorded hash')
            self._loaded = (stamp, CheckpointState(self.directory, manifest))
        state = self._loaded[1]
        if check_config and (differ := config_differences(state.manifest['config'], self.config)):
            raise CheckpointError(f'the checkpoint in {self.directory} is of another run: '
                                  f'{", ".join(differ)}; use the same settings, choose '
                                  'another `checkpoint_dir`, or remove it')
        self._sequence = state.manifest['sequence']
        return state

    # -- writing --------------------------------------------------------------------------

    def _place(self, work, stem, net, trainer, replaced, placed):
        """Write the params and states in ``work``, record them, move them in, adding each to
        ``placed`` as it is moved.

        The record also names the ``replaced`` checkpoint's files: killed after
        the new manifest is in place, this save leaves them for the next to remove.
        """
        entries = {}
        for role, write in (('params', net.save_parameters),
                            ('states', _states_writer(net, trainer))):
            tmp = os.path.join(work, role)
            try:
                if write is not _create_empty:
                    fs.external(tmp)  # MXNet writes the file itself
                write(tmp)
            except mx.base.MXNetError as e:  # MXNet's file stream: no errno, say what it is
                raise OSError(errno.EIO, 'the write stopped short (disk full or file size limit?)',
                              os.path.join(self.directory, f'{stem}.{role}')) from e
            atomic.fsync_path(tmp)
            entries[role] = {'name': f'{stem}.{role}', 'bytes': os.path.getsize(tmp),
                             'sha256': savefolder.sha256(tmp)}
        atomic.create_exclusive(os.path.join(work, savefolder.PLACED), json.dumps(
            {'placed': entries, 'replaced': replaced}).encode())
        atomic.fsync_path(work)
        for role, entry in entries.items():
            final = os.path.join(self.directory, entry['name'])
            if os.path.lexists(final):  # put there during the run: not ours to replace
                raise CheckpointError(f'{final} appeared in the checkpoint directory during the '
                                      'run; move it away and resume')
            fs.replace(os.path.join(work, role), final)
            placed[role] = entry
        return entries

    def _manifest(self, epoch, partial, history, files):
        written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
        return {'format': FORMAT, 'sequence': self._sequence, 'written': written, 'epoch': epoch,
                'partial': partial.to_dict() if partial is not None else None,
                'history': [r.to_dict() for r in history], 'config': self.config, 'files': files,
                'data_order': {'seed': self.config.get('seed'), 'next_epoch': epoch}}

    def save(self, net, trainer, history, epoch, partial=None):
        """Write a complete checkpoint after ``epoch`` epochs (and ``partial`` of the next).

        A save that fails raises, having removed what it placed (or left it
        recognisably the package's, for the next save to remove): the last
        complete checkpoint stays as it was, unless the new one is complete.
        """
        if not os.path.isdir(self.directory):  # made if missing (its parent must exist)
            try:
                with contextlib.suppress(FileExistsError):
                    fs.mkdir(self.directory)
            except FileNotFoundError:
                raise CheckpointError(f'checkpoint directory {self.directory}: directory '
                                      f'{os.path.dirname(self.directory)} does not exist; create '
                                      'it first') from None
        old = {}
        with contextlib.suppress(CheckpointError):
            old = self._read_manifest()['files'] if self.exists() else {}
        replaced = {e['name'] for e in old.values()}
        self._clean(set(), keep=replaced)  # what killed saves left, before placing new files
        self._sequence = self._sequence % MAX_SEQUENCE + 1  # the names need only be new
        work = savefolder.make(self.directory)
        placed, staged, made = {}, os.path.join(work, MANIFEST), None
        try:
            files = self._place(work, f'ckpt-{self._sequence:06d}', net, trainer, old, placed)
            text = json.dumps(self._manifest(epoch, partial, history, files), indent=2) + '\n'
            made = atomic.create_exclusive(staged, text.encode())  # its inode
            atomic.fsync_path(self.directory)  # the files placed durable before what names them
            fs.replace(staged, self.manifest_path)  # the new checkpoint is complete here
        except BaseException:
            if made is None or atomic._inode(self.manifest_path) != made:  # not committed
                self._undo(work, placed)
            raise
        new = {entry['name'] for entry in files.values()}
        try:
            atomic.fsync_path(self.directory)
        finally:  # the new checkpoint is in place: leave no old files beside it either
            self._finish(replaced - new, new)

    def _finish(self, replaced, keep):
        """After the new manifest is in place: remove the ``replaced`` files and the save's folder.

        When a removal fails, the removals are tried once more, through the save's record (its
        folder goes last, so the record is still there), and the first error is raised all the
        same (the new checkpoint is complete; the disk said no). What a second failure leaves
        stays recognisable for the next save or ``recover`` to remove.
        """
        try:
            self._clean(replaced, keep)
        except OSError:
            with contextlib.suppress(OSError):  # the first error is the one to raise
                self._clean(set(), keep)
            raise

    def _undo(self, work, placed):
        """Remove what a failed save placed, then its folder; what cannot be removed stays
        recognisable (the record in ``work`` names it) for the next save to remove."""
        with contextlib.suppress(OSError):  # the save's own error is the one to raise
            for entry in placed.values():  # placed, but no manifest names them
                fs.unlink(os.path.join(self.directory, entry['name']), missing_ok=True)
            savefolder.remove(work)

    def _clean(self, replaced, keep):
        """Remove ``replaced`` and what killed saves left, never ``keep``; nothing else; return
        the names removed.

        The files go first, then the folders: a folder's record names its files.
        """
        folders, placed = savefolder.leftovers(self.directory, keep)
        removed = []
        for name in sorted((replaced | placed) - set(keep)):
            if savefolder.is_regular(os.path.join(self.directory, name)):
                fs.unlink(os.path.join(self.directory, name), missing_ok=True)
                removed.append(name)
        if removed and folders:  # durable before the records naming them go
            atomic.fsync_path(self.directory)
        for folder in folders:
            savefolder.remove(folder)
            removed.append(os.path.basename(folder))
        return removed

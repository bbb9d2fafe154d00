"""Checkpoints that survive a crash at any moment: a hook of ``train`` that saves and resumes.

A checkpoint directory holds at most one complete checkpoint, described by
``manifest.json``: the parameters (``save_parameters``), the Trainer's
optimizer state (``save_states``), the epochs done, the batches done in the
next epoch when it was stopped part-way (with that part's running totals),
the data order's seed, the history so far, and the settings of the run.

A save writes its files into a private folder it makes in the directory
(``.ckpt-save.XXXXXXXX``, an unpredictable name, mode 0700), flushes and
fsyncs them, records there the names and hashes it is about to place, renames
them into the directory, and writes the manifest last, naming its files by
content hash: until the new manifest has been renamed into place, the old one
still describes files that are all still there. A crash, SIGKILL or full disk
at any moment therefore leaves the last complete checkpoint intact.

Nothing is written through a link, nothing outside the directory is touched,
and nothing in it is removed but what this package owns: the files of the
checkpoint being replaced (named in its manifest), and what a killed save
left (its private folder, and files it had placed, recognised by the names
and hashes it recorded). Any other ``ckpt-NNNNNN.params`` or ``.states`` is
someone else's: a run refuses to start beside it rather than delete it. A
lock (``flock`` on ``.lock``) held while a run uses the directory refuses a
second run; the operating system drops it when the process ends, however it
ends, so a ``.lock`` left by a killed run is simply taken over.

The optimizer state is an array file (``states``), not MXNet's pickle:
loading a checkpoint runs no code, whoever wrote it. A checkpoint from
elsewhere can still hold any weights it likes, and its hashes only say that
its files are the ones its manifest names, not who wrote them.
"""
import datetime
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx

from ..errors import CheckpointError, GluonMultiGPUError
from .files import CHECKPOINT_FILE, atomic_write, check_output_dir
from . import fs
from .locks import Lock
from .manifest import FORMAT, MAX_SEQUENCE, read_manifest, validate_manifest
from .states import load_trainer_states, save_trainer_states
from ..core.data import DATASETS, ArrayLoader
from ..core.results import EpochRecord, EpochTotals
from ..core.training import Hook

__all__ = ['Checkpointer', 'CheckpointReader', 'CheckpointState', 'MANIFEST', 'FORMAT',
           'run_config', 'for_run', 'check_resumable']

MANIFEST = 'manifest.json'
LOCK = '.lock'
#: The private folder of a save, and the record in it of the files it places.
_SAVE_DIR = re.compile(r'\.ckpt-save\.[A-Za-z0-9_]+')
_PLACED = 'placed.json'
#: What a killed atomic write of the manifest leaves (``files.atomic_write``).
_MANIFEST_TMP = re.compile(r'\.manifest\.json\.[A-Za-z0-9_]+\.tmp')


def _open_regular(path):
    """Open ``path`` for reading without following a link; raise OSError unless a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, 'not a regular file', path)
    return os.fdopen(fd, 'rb')


def _sha256(path):
    digest = hashlib.sha256()
    with _open_regular(path) as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def _is_regular(path):
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


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
        return lambda path: open(path, 'xb').close()
    return lambda path: save_trainer_states(trainer, path)


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
        params, states = (files[role]['name'] for role in ('params', 'states'))
        try:
            net.load_parameters(os.path.join(self.directory, params), ctx=devices)
        except mx.base.MXNetError:
            raise _damaged(self.directory, f'{params} does not load into this network') from None
        except (AssertionError, ValueError, KeyError, IndexError) as e:  # Gluon's checks
            raise _damaged(self.directory, f'{params} does not load into this network '
                           f'({str(e).strip()[:200]})') from None
        if files['states']['bytes']:  # empty: the servers of a parameter server held it
            try:
                load_trainer_states(trainer, os.path.join(self.directory, states))
            except CheckpointError as e:
                raise _damaged(self.directory, f'{states} is not an optimizer state of this '
                               f'network: {e}') from None


def _damaged(directory, why):
    return CheckpointError(f'the checkpoint in {directory} is damaged: {why}; remove it or '
                           'choose another `checkpoint_dir`')


def run_config(model, dataset, batch_size, lr, seed=0, num_train=None, num_test=None, *,
               book_literal=False, workers=1, dtype='float32', sync_bn=False):
    """The settings of a run that its checkpoint records and a resumed run must match.

    ``num_train``/``num_test`` None: the whole data set. ``workers``,
    ``dtype`` and ``sync_bn`` are recorded only when they differ from a
    plain run (1, float32, off), so that checkpoints of plain runs stay as
    they were; absent, they still count (``Checkpointer.load``).
    """
    config = {'model': model, 'dataset': dataset, 'batch_size': batch_size, 'lr': lr,
              'seed': seed, 'num_train': num_train or DATASETS[dataset]['train'],
              'num_test': num_test or DATASETS[dataset]['test'], 'book_literal': book_literal}
    if workers > 1:
        config['workers'] = workers  # a resumed run needs as many
    if dtype != 'float32':
        config['dtype'] = dtype
    if sync_bn:
        config['sync_bn'] = True
    return config


def for_run(checkpoint_dir, config, resume=False, kvstores=('device',), rank=0):
    """The checkpoint hook of a run with settings ``config`` (``run_config``), or None without
    ``checkpoint_dir``.

    Refuses (``GluonMultiGPUError``) what a checkpoint cannot follow: several
    kvstores compared in turn, the text's loop (``config['book_literal']``),
    ``dist_async`` (the optimizer lives on the servers); and ``resume``
    without a directory. On a parameter server the first worker (``rank``
    0) saves; the others get a ``CheckpointReader``, which only resumes.
    """
    if resume and not checkpoint_dir:
        raise GluonMultiGPUError('`resume=True` needs `checkpoint_dir` DIR, the directory to '
                                 'resume from')
    if not checkpoint_dir:
        return None
    if len(set(kvstores)) > 1:
        raise GluonMultiGPUError('`checkpoint_dir` follows one run; give a single `kvstore`')
    if config.get('book_literal'):
        raise GluonMultiGPUError("`book_literal` runs the text's loop, which keeps no "
                                 'checkpoints; drop `checkpoint_dir` or `book_literal`')
    if 'dist_async' in kvstores:
        raise GluonMultiGPUError('`kvstore` dist_async keeps the optimizer on the servers, which '
                                 'a checkpoint cannot save; drop `checkpoint_dir` or use dist_sync')
    return (CheckpointReader if rank else Checkpointer)(checkpoint_dir, config, resume=resume)


def check_resumable(data):
    """Raise ``CheckpointError`` unless a checkpoint can replay the order of ``data``'s batches.

    A resumed run must see the batches the interrupted one would have seen:
    the package's loaders (``data.ArrayLoader``, from ``load_data`` or
    ``synthetic_data``) draw each epoch's order from their seed and the
    epoch alone, and ``epoch = e`` replays epoch ``e``. So does any iterable
    with an integer ``epoch`` that means the same. Another iterable (a list,
    a generator, a Gluon ``DataLoader``) cannot say where its order stood, and
    resuming it would go on with other batches than the run's.
    """
    epoch = getattr(data, 'epoch', None)
    if isinstance(data, ArrayLoader) or (isinstance(epoch, int) and not isinstance(epoch, bool)):
        return
    raise CheckpointError(f'a checkpoint resumes the order of the training batches, which this '
                          f'{type(data).__name__} cannot replay; load the data with '
                          'gm.load_data (or wrap arrays in gm.data.ArrayLoader), or train '
                          'without a Checkpointer')


class Checkpointer(Hook):
    """Save a run after every epoch and when it is stopped; resume it (a ``train`` hook).

    A resumed run replays the order of the training batches, so the data
    must be the package's loaders (``load_data``, ``data.ArrayLoader``; see
    ``check_resumable``): other data is refused before the first step.
    ``for_run`` makes the Checkpointer of a run from its settings (``run_config``).

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
        """Whether the directory holds a manifest (complete or not; or something in its place)."""
        return os.path.lexists(self.manifest_path)

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
            self._check_foreign(())
            return
        if not self.resume:
            raise CheckpointError(f'{self.directory} already holds a checkpoint '
                                  f'({self.describe()}); add `resume=True` to continue it, or '
                                  'choose another `checkpoint_dir`')
        state = self.load()  # refuses a damaged checkpoint or one of another run
        self._check_foreign(entry['name'] for entry in state.manifest['files'].values())
        self._check_arrays(state)
        if num_epochs is not None and state.epoch > num_epochs:
            raise CheckpointError(f'the checkpoint in {self.directory} has {state.epoch} epochs '
                                  f'done, more than the {num_epochs} asked for; ask for '
                                  f'`num_epochs` {state.epoch} or more')
        self._check_partial(state, batches_per_epoch)

    def _check_arrays(self, state):
        """Raise unless the checkpoint's files are array files MXNet reads (before any work)."""
        for role, entry in state.manifest['files'].items():
            if entry['bytes'] == 0 and role == 'states':
                continue  # a parameter server's: its servers held the state
            try:
                mx.nd.load(os.path.join(self.directory, entry['name']))
            except mx.base.MXNetError:
                raise self._damaged(f'{entry["name"]} is not an array file MXNet can read'
                                    + (' (an optimizer state is never a pickle here)'
                                       if role == 'states' else '')) from None

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
            fs.mkdir(self.directory)
            self._made = True
        self._lock = Lock(os.path.join(self.directory, LOCK),
                          held=lambda who: f'another run is using the checkpoint directory '
                                           f'{self.directory}{who}; wait for it to end or choose '
                                           'another `checkpoint_dir`',
                          fix='choose another `checkpoint_dir`', error=CheckpointError)
        try:
            self._lock.acquire()
        except BaseException:
            self._lock = None
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        """Unlock and remove the lock file; a directory made by this run, still empty, goes too."""
        if self._lock is not None:
            self._lock.release()  # the file removed while still held, if still ours
            self._lock = None
        if self._made and not self.exists():
            try:
                fs.rmdir(self.directory)
            except OSError:
                pass  # something was put there meanwhile: keep it
        return False

    # -- reading --------------------------------------------------------------------------

    def _damaged(self, why):
        return _damaged(self.directory, why)

    def _read_manifest(self):
        try:
            with _open_regular(self.manifest_path) as f:
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
                if not _is_regular(path):
                    raise self._damaged(f'its {role} file {entry["name"]} is not a regular file '
                                        '(a link or a directory)')
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

    def _leftovers(self, keep=()):
        """What killed saves left here: ``(their private folders, the files they placed)``.

        A placed file counts only while it still has the name, size and hash
        its save recorded: anything else under a checkpoint's name is not ours.
        Files named in ``keep`` (the manifest's) are never leftovers.
        """
        folders, placed = [], set()
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return folders, placed
        for name in names:
            path = os.path.join(self.directory, name)
            if not _SAVE_DIR.fullmatch(name) or os.path.islink(path) or not os.path.isdir(path):
                continue
            folders.append(path)
            try:
                with _open_regular(os.path.join(path, _PLACED)) as f:
                    record = json.loads(f.read(1 << 16))
                entries = [*record['placed'].values(), *record['replaced'].values()]
            except (OSError, ValueError, AttributeError, KeyError, TypeError):
                continue
            for entry in entries:
                try:
                    target = os.path.join(self.directory, entry['name'])
                    if entry['name'] not in keep and CHECKPOINT_FILE.fullmatch(entry['name']) \
                            and _is_regular(target) and \
                            os.path.getsize(target) == entry['bytes'] and \
                            _sha256(target) == entry['sha256']:
                        placed.add(entry['name'])
                except (TypeError, KeyError, OSError):
                    pass
        return folders, placed

    def _foreign(self, named):
        """The files here with a checkpoint's name that neither ``named`` nor a killed save owns."""
        try:
            candidates = {n for n in os.listdir(self.directory) if CHECKPOINT_FILE.fullmatch(n)}
        except FileNotFoundError:
            return []
        named = set(named)
        return sorted(candidates - named - self._leftovers(named)[1])

    def _check_foreign(self, named):
        foreign = self._foreign(named)
        if foreign:
            more = f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''
            raise CheckpointError(f'{self.directory} holds {foreign[0]}{more}, which no '
                                  'checkpoint of this package there names (a file of your own?); '
                                  'move it away or choose another `checkpoint_dir`')

    def _place(self, work, stem, net, trainer, replaced):
        """Write the params and states in ``work``, record them, move them in; return the entries.

        The record also names the ``replaced`` checkpoint's files: killed after
        the new manifest is in place, this save leaves them for the next to remove.
        """
        entries = {}
        for role, write in (('params', net.save_parameters), ('states', _states_writer(trainer))):
            tmp = os.path.join(work, role)
            try:
                write(tmp)
            except mx.base.MXNetError as e:  # MXNet's file stream: no errno, say what it is
                raise OSError(errno.EIO, 'the write stopped short (disk full or file size limit?)',
                              os.path.join(self.directory, f'{stem}.{role}')) from e
            _fsync(tmp)
            entries[role] = {'name': f'{stem}.{role}', 'bytes': os.path.getsize(tmp),
                             'sha256': _sha256(tmp)}
        with atomic_write(os.path.join(work, _PLACED), follow_links=False) as f:
            json.dump({'placed': entries, 'replaced': replaced}, f)
        _fsync(work)
        for role, entry in entries.items():
            final = os.path.join(self.directory, entry['name'])
            if os.path.lexists(final):  # put there during the run: not ours to replace
                raise CheckpointError(f'{final} appeared in the checkpoint directory during the '
                                      'run; move it away and resume')
            os.replace(os.path.join(work, role), final)
        return entries

    def save(self, net, trainer, history, epoch, partial=None):
        """Write a complete checkpoint after ``epoch`` epochs (and ``partial`` of the next)."""
        os.makedirs(self.directory, exist_ok=True)
        try:
            old = self._read_manifest()['files'] if self.exists() else {}
        except CheckpointError:
            old = {}
        replaced = {e['name'] for e in old.values()}
        self._clean(set(), keep=replaced)  # what killed saves left, before placing new files
        self._sequence = self._sequence % MAX_SEQUENCE + 1  # the names need only be new
        stem = f'ckpt-{self._sequence:06d}'
        work = tempfile.mkdtemp(prefix='.ckpt-save.', dir=self.directory)
        files = {}
        try:
            files = self._place(work, stem, net, trainer, old)
            manifest = {
                'format': FORMAT, 'sequence': self._sequence,
                'written': datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec='seconds'),
                'epoch': epoch, 'partial': partial._asdict() if partial is not None else None,
                'history': [vars(r) for r in history], 'config': self.config, 'files': files,
                'data_order': {'seed': self.config.get('seed'), 'next_epoch': epoch},
            }
            with atomic_write(self.manifest_path, follow_links=False) as f:
                json.dump(manifest, f, indent=2)
                f.write('\n')
            _fsync(self.directory)
        except BaseException:
            for entry in files.values():  # placed, but no manifest names them
                _remove(os.path.join(self.directory, entry['name']))
            shutil.rmtree(work, ignore_errors=True)
            raise
        new = {entry['name'] for entry in files.values()}
        self._clean(replaced - new, keep=new)

    def _clean(self, replaced, keep):
        """Remove ``replaced`` and what killed saves left, never ``keep``; nothing else."""
        folders, placed = self._leftovers(keep)
        for name in (replaced | placed) - set(keep):
            if _is_regular(os.path.join(self.directory, name)):
                _remove(os.path.join(self.directory, name))
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)  # removes links inside, never follows them
        for name in os.listdir(self.directory):
            if _MANIFEST_TMP.fullmatch(name) and _is_regular(os.path.join(self.directory, name)):
                _remove(os.path.join(self.directory, name))

    # -- as a hook of train ----------------------------------------------------------------

    def begin(self, run):
        """Refuse data whose order cannot be resumed (``check_resumable``), before any step; with
        ``resume``: restore the parameters, the Trainer and the history; say where to go on."""
        check_resumable(run.train_iter)
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

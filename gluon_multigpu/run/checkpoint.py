"""Checkpoints that survive a crash at any moment: a hook of ``train`` that saves and resumes.

A checkpoint directory holds at most one complete checkpoint, described by
``manifest.json``: the parameters (``save_parameters``), the Trainer's
optimizer state (``save_states``), the epochs done, the batches done in the
next epoch when it was stopped part-way (with that part's running totals),
the data order's seed, the history so far, and the settings of the run.

A save writes its files into a private folder it makes in the directory
(``savefolder``: an unpredictable name, mode 0700, marked as the package's by
a marker file written first), fsyncs them, records there the names and hashes
it is about to place, renames them into the directory, and renames the
manifest in last, naming its files by content hash: until the new manifest
has been renamed into place, the old one still describes files that are all
still there. A crash, SIGKILL or full disk at any moment therefore leaves the
last complete checkpoint intact; a failed save removes what it had placed.
Every change to the directory goes through ``fs`` (MXNet's own writes are
announced there), so that a fault can be put into each of them in tests.

Nothing is written through a link, nothing outside the directory is touched,
and nothing in it is removed but what this package owns: the files of the
checkpoint being replaced (named in its manifest), and what a killed save
left (its private folder, recognised by its marker, never by its name alone,
and files it had placed, recognised by the names and hashes it recorded).
Any other ``ckpt-NNNNNN.params`` or ``.states`` is someone else's: a run
refuses to start beside it rather than delete it. Nor does a run write over
another run's checkpoint: a Checkpointer without ``resume`` refuses a
directory that holds a checkpoint, and with it one of other settings, before
it writes anything (``check_directory``, or its first ``begin`` or ``save``).
A lock (``flock`` on ``.lock``) held while a run uses the directory refuses a
second run; the operating system drops it when the process ends, however it
ends, so a ``.lock`` left by a killed run is simply taken over.

The optimizer state is an array file (``states``), not MXNet's pickle:
loading a checkpoint runs no code, whoever wrote it. A checkpoint from
elsewhere can still hold any weights it likes, and its hashes only say that
its files are the ones its manifest names, not who wrote them.
"""
import datetime
import errno
import json
import os

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx

from ..errors import CheckpointError, GluonMultiGPUError
from ..base import fs
from . import savefolder
from .savefolder import is_regular as _is_regular, open_regular as _open_regular, \
    sha256 as _sha256
from .files import CHECKPOINT_FILE, check_output_dir
from .locks import Lock
from .manifest import FORMAT, MAX_SEQUENCE, read_manifest, validate_manifest
from .states import load_trainer_states, save_trainer_states
from ..core.data import DATASETS, ArrayLoader
from ..core.results import EpochRecord, EpochTotals
from ..core.training import Hook

__all__ = ['Checkpointer', 'CheckpointReader', 'CheckpointState', 'MANIFEST', 'FORMAT',
           'run_config', 'for_run', 'check_resumable', 'recover']

MANIFEST = 'manifest.json'
LOCK = '.lock'


def _remove(path):
    try:
        fs.unlink(path)
    except FileNotFoundError:
        pass


def _write_params(net):
    def write(path):
        fs.external(path)  # MXNet writes the file itself
        net.save_parameters(path)
    return write


def _create_empty(path):
    os.close(fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))


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
        return _create_empty

    def write(path):
        fs.external(path)  # MXNet's array file (``mx.nd.save``)
        save_trainer_states(trainer, path)
    return write


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
        Continue from the checkpoint in ``directory``, if it holds one. A
        checkpoint there is refused without it, and one of other ``config``
        with it (``check_directory``; else at the first ``begin`` or ``save``).
    """

    def __init__(self, directory, config, resume=False):
        self.directory = os.path.abspath(directory)
        self.config, self.resume = dict(config), resume
        self._sequence = 0
        self._loaded = None  # (manifest stat, state): the checks and hashes are done once
        self._lock, self._made = None, False
        self._claimed = False  # checked that this run may write here (``_claim``)

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
        Then what killed saves left is removed (``_clean``). Call it holding
        the lock (inside ``with checkpointer:``). Without it, the first
        ``begin`` or ``save`` still refuses another run's checkpoint.
        """
        state = self._check_run()
        if state is not None:
            self._check_arrays(state)
            if num_epochs is not None and state.epoch > num_epochs:
                raise CheckpointError(f'the checkpoint in {self.directory} has {state.epoch} '
                                      f'epochs done, more than the {num_epochs} asked for; ask '
                                      f'for `num_epochs` {state.epoch} or more')
            self._check_partial(state, batches_per_epoch)
        self._claim(state)

    def _check_run(self):
        """Raise ``CheckpointError`` unless this run may write here; return the checkpoint it
        continues (a ``CheckpointState``), or None.

        Another run's checkpoint is refused: any checkpoint (complete or
        damaged) without ``resume``, and with it a damaged one or one of other
        settings (``load``); so are files with a checkpoint's name that no
        checkpoint here names (``_check_foreign``).
        """
        if not self.exists():
            self._check_foreign(())
            return None
        if not self.resume:
            raise CheckpointError(f'{self.directory} already holds a checkpoint '
                                  f'({self.describe()}); add `resume=True` to continue it, choose '
                                  'another `checkpoint_dir`, or remove it')
        state = self.load()  # refuses a damaged checkpoint or one of another run
        self._check_foreign(entry['name'] for entry in state.manifest['files'].values())
        return state

    def _claim(self, state=False):
        """Check (``_check_run``, unless its ``state`` is given), then remove what killed saves
        left; from then on this run's saves may replace the checkpoint here."""
        if state is False:
            state = self._check_run()
        keep = {entry['name'] for entry in state.manifest['files'].values()} if state else set()
        self._clean(set(), keep)
        self._claimed = True

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
        if not os.path.isdir(self.directory):
            check_output_dir(self.directory, 'checkpoint directory')  # its probe: in the parent
            fs.mkdir(self.directory)
            self._made = True
        # An existing directory gets no probe file (a kill would leave it, unrecognisable): the
        # lock file, created next, is the test that files can be created in it.
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
                                      f'{", ".join(differ)}; use the same settings, choose '
                                      'another `checkpoint_dir`, or remove it')
        self._sequence = state.manifest['sequence']
        return state

    # -- writing --------------------------------------------------------------------------

    def _foreign(self, named):
        """The files here with a checkpoint's name that neither ``named`` nor a killed save owns."""
        try:
            candidates = {n for n in os.listdir(self.directory) if CHECKPOINT_FILE.fullmatch(n)}
        except FileNotFoundError:
            return []
        named = set(named)
        return sorted(candidates - named - savefolder.leftovers(self.directory, named)[1])

    def _check_foreign(self, named):
        foreign = self._foreign(named)
        if foreign:
            more = f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''
            raise CheckpointError(f'{self.directory} holds {foreign[0]}{more}, which no '
                                  'checkpoint of this package there names (a file of your own?); '
                                  'move it away or choose another `checkpoint_dir`')

    def _place(self, work, stem, net, trainer, replaced, placed):
        """Write the params and states in ``work``, record them, move them in, adding each to
        ``placed`` as it is moved.

        The record also names the ``replaced`` checkpoint's files: killed after
        the new manifest is in place, this save leaves them for the next to remove.
        """
        entries = {}
        for role, write in (('params', _write_params(net)), ('states', _states_writer(trainer))):
            tmp = os.path.join(work, role)
            try:
                write(tmp)
            except mx.base.MXNetError as e:  # MXNet's file stream: no errno, say what it is
                raise OSError(errno.EIO, 'the write stopped short (disk full or file size limit?)',
                              os.path.join(self.directory, f'{stem}.{role}')) from e
            savefolder.fsync(tmp)
            entries[role] = {'name': f'{stem}.{role}', 'bytes': os.path.getsize(tmp),
                             'sha256': _sha256(tmp)}
        savefolder.write_file(os.path.join(work, savefolder.PLACED), json.dumps(
            {'placed': entries, 'replaced': replaced}).encode())
        savefolder.fsync(work)
        for role, entry in entries.items():
            final = os.path.join(self.directory, entry['name'])
            if os.path.lexists(final):  # put there during the run: not ours to replace
                raise CheckpointError(f'{final} appeared in the checkpoint directory during the '
                                      'run; move it away and resume')
            fs.replace(os.path.join(work, role), final)
            placed[role] = entry
        return entries

    def _manifest(self, epoch, partial, history, files):
        return {
            'format': FORMAT, 'sequence': self._sequence,
            'written': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'epoch': epoch, 'partial': partial._asdict() if partial is not None else None,
            'history': [vars(r) for r in history], 'config': self.config, 'files': files,
            'data_order': {'seed': self.config.get('seed'), 'next_epoch': epoch},
        }

    def _make_directory(self):
        """Make the directory if missing (its parent must exist)."""
        if not os.path.isdir(self.directory):
            try:
                fs.mkdir(self.directory)
            except FileExistsError:
                pass
            except FileNotFoundError:
                raise CheckpointError(f'checkpoint directory {self.directory}: directory '
                                      f'{os.path.dirname(self.directory)} does not exist; '
                                      'create it first') from None

    def save(self, net, trainer, history, epoch, partial=None):
        """Write a complete checkpoint after ``epoch`` epochs (and ``partial`` of the next).

        The first save of a Checkpointer that has not checked the directory
        (``check_directory``, ``begin``) checks it first: another run's
        checkpoint is refused before anything is written. A save that fails
        raises, having removed what it placed (or left it recognisably the
        package's, for the next save to remove): the last complete checkpoint
        stays as it was, unless the new one is complete.
        """
        if not self._claimed:
            self._claim()
        self._make_directory()
        try:
            old = self._read_manifest()['files'] if self.exists() else {}
        except CheckpointError:
            old = {}
        replaced = {e['name'] for e in old.values()}
        self._clean(set(), keep=replaced)  # what killed saves left, before placing new files
        self._sequence = self._sequence % MAX_SEQUENCE + 1  # the names need only be new
        work = savefolder.make(self.directory)
        placed, staged, made = {}, os.path.join(work, MANIFEST), None
        try:
            files = self._place(work, f'ckpt-{self._sequence:06d}', net, trainer, old, placed)
            text = json.dumps(self._manifest(epoch, partial, history, files), indent=2) + '\n'
            savefolder.write_file(staged, text.encode())
            made = os.lstat(staged).st_ino
            fs.replace(staged, self.manifest_path)  # the new checkpoint is complete here
        except BaseException:
            if not self._committed(made):
                self._undo(work, placed)
            raise
        new = {entry['name'] for entry in files.values()}
        try:
            savefolder.fsync(self.directory)
        except OSError:  # the new checkpoint is in place: leave no old files beside it either
            self._finish(replaced - new, new)
            raise
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
            try:
                self._clean(set(), keep)
            except OSError:
                pass  # the first error is the one to raise
            raise

    def _committed(self, made):
        """Whether the manifest in place is the one a save staged (inode ``made``, or None)."""
        try:
            return made is not None and os.lstat(self.manifest_path).st_ino == made
        except OSError:
            return False

    def _undo(self, work, placed):
        """Remove what a failed save placed, then its folder; what cannot be removed stays
        recognisable (the record in ``work`` names it) for the next save to remove."""
        try:
            for entry in placed.values():  # placed, but no manifest names them
                _remove(os.path.join(self.directory, entry['name']))
            savefolder.remove(work)
        except OSError:
            pass  # the save's own error is the one to raise

    def _clean(self, replaced, keep):
        """Remove ``replaced`` and what killed saves left, never ``keep``; nothing else; return
        the names removed.

        The files go first, then the folders: a folder's record names its files.
        """
        folders, placed = savefolder.leftovers(self.directory, keep)
        removed = []
        for name in sorted((replaced | placed) - set(keep)):
            if _is_regular(os.path.join(self.directory, name)):
                _remove(os.path.join(self.directory, name))
                removed.append(name)
        for folder in folders:
            savefolder.remove(folder)
            removed.append(os.path.basename(folder))
        return removed

    # -- as a hook of train ----------------------------------------------------------------

    def begin(self, run):
        """Refuse data whose order cannot be resumed (``check_resumable``) and another run's
        checkpoint (``check_directory``), before any step; with ``resume``: restore the
        parameters, the Trainer and the history; say where to go on."""
        check_resumable(run.train_iter)
        state = self._check_run()
        self._claim(state)
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

    def _clean(self, replaced, keep):
        """Nothing: the first worker's saves are its own to clean."""
        return []


def recover(directory):
    """Remove what killed saves left in the checkpoint directory ``directory``; return the names
    removed (files and save folders).

    It does what the next ``Checkpointer`` opening the directory does, holding its lock: a
    save's folder is recognised by its marker, a file it placed by the name, size and hash its
    record gives; the files the manifest in place names are kept. Nothing is removed while
    another run holds the directory (``CheckpointError``), nor beside a manifest that cannot be
    read (which one is current is then not known). A name at ``.lock`` that is not a lock of the
    package stops every run here, so the directory is cleaned without one.
    """
    ckpt = Checkpointer(directory, {}, resume=True)  # not entered: the lock is taken below
    if not os.path.isdir(ckpt.directory):
        return []
    busy = []

    def held(who):
        busy.append(who)
        return f'another run is using the checkpoint directory {ckpt.directory}{who}; wait ' \
               'for it to end'
    lock = Lock(os.path.join(ckpt.directory, LOCK), held=held, fix='leave it',
                error=CheckpointError)
    try:
        lock.acquire()
    except CheckpointError:
        if busy:
            raise
        lock = None
    try:
        try:
            keep = {e['name'] for e in ckpt._read_manifest()['files'].values()} \
                if ckpt.exists() else set()
        except CheckpointError:
            return []
        return ckpt._clean(set(), keep)
    finally:
        if lock is not None:
            lock.release()

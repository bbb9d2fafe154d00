"""Checkpoints that survive a crash at any moment: a hook of ``train`` that saves and resumes.

``Checkpointer`` is the hook: it saves a run after every epoch and when it is
stopped, and resumes it. What a checkpoint holds and how a save replaces it
so that a crash, SIGKILL or full disk leaves the last complete one intact is
``checkpoint_store``'s (``CheckpointStore``, which it extends); this module
says whether a run may use a directory, and locks it while it does.
"""
import contextlib
import os

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx

from ..errors import CheckpointError, GluonMultiGPUError
from ..filesafety import fs
from . import savefolder
from .checkpoint_store import MANIFEST, CheckpointState, CheckpointStore
from ..filesafety.targets import CHECKPOINT_FILE, check_output_dir
from ..filesafety.lockfile import Lock
from .manifest import FORMAT
from ..section.data import ArrayLoader
from ..machinery.training import Hook

__all__ = ['Checkpointer', 'CheckpointReader', 'CheckpointState', 'MANIFEST', 'FORMAT',
           'for_run', 'check_resumable', 'recover']

LOCK = '.lock'


def _lock(directory, then, fix):
    """The lock of the checkpoint directory ``directory``; ``then`` ends the message when another
    run holds it, ``fix`` when something else has its name."""
    return Lock(os.path.join(directory, LOCK), held=lambda who: 'another run is using the '
                f'checkpoint directory {directory}{who}; {then}', fix=fix, error=CheckpointError)


def for_run(checkpoint_dir, config, resume=False, kvstores=('device',), rank=0):
    """The checkpoint hook of a run with settings ``config`` (``RunConfig.recorded``), or None without
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


class Checkpointer(CheckpointStore, Hook):
    """Save a run after every epoch and when it is stopped; resume it (a ``train`` hook).

    A resumed run replays the order of the training batches, so the data
    must be the package's loaders (``load_data``, ``data.ArrayLoader``; see
    ``check_resumable``): other data is refused before the first step.
    ``for_run`` makes the Checkpointer of a run from its settings (``RunConfig.recorded``).

    Parameters
    ----------
    directory : str
        The checkpoint folder; made when the first checkpoint is saved.
    config : dict
        What the run is (``RunConfig.recorded``): a resumed run must have the
        same, field by field; a difference is named by its flag.
    resume : bool
        Whether to go on from the checkpoint in ``directory``; without it a
        folder that holds one is refused rather than overwritten.
    """

    def __init__(self, directory, config, resume=False):
        super().__init__(directory, config)
        # ``_claimed``: checked that this run may write here (``_claim``)
        self.resume, self._lock, self._made, self._claimed = resume, None, False, False

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
            self._check_foreign(set())
            return None
        if not self.resume:
            raise CheckpointError(f'{self.directory} already holds a checkpoint '
                                  f'({self.describe()}); add `resume=True` to continue it, choose '
                                  'another `checkpoint_dir`, or remove it')
        state = self.load()  # refuses a damaged checkpoint or one of another run
        self._check_foreign({entry['name'] for entry in state.manifest['files'].values()})
        return state

    def _check_foreign(self, named):
        """Refuse the files here with a checkpoint's name that neither ``named`` (a set) nor a
        killed save owns."""
        try:
            candidates = {n for n in os.listdir(self.directory) if CHECKPOINT_FILE.fullmatch(n)}
        except FileNotFoundError:
            return
        if foreign := sorted(candidates - named - savefolder.leftovers(self.directory, named)[1]):
            more = f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''
            raise CheckpointError(f'{self.directory} holds {foreign[0]}{more}, which no '
                                  'checkpoint of this package there names (a file of your own?); '
                                  'move it away or choose another `checkpoint_dir`')

    def _claim(self, state):
        """Remove what killed saves left, once ``_check_run`` said this run may write here (its
        ``state``); from then on this run's saves may replace the checkpoint here."""
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
            raise self._damaged(f'{MANIFEST}: its field partial.batches ({state.partial.batches}) '
                                f'is past the end of an epoch of {batches_per_epoch} batches')

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
        self._lock = _lock(self.directory, 'wait for it to end or choose another `checkpoint_dir`',
                           'choose another `checkpoint_dir`')
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
            with contextlib.suppress(OSError):  # not if something was put there meanwhile
                fs.rmdir(self.directory)


    def save(self, net, trainer, history, epoch, partial=None):
        """Write a complete checkpoint after ``epoch`` epochs (and ``partial`` of the next).

        The first save of a Checkpointer that has not checked the directory
        (``check_directory``, ``begin``) checks it first: another run's
        checkpoint is refused before anything is written. A save that fails
        raises, having removed what it placed (or left it recognisably the
        package's, for the next save to remove): the last complete checkpoint
        stays as it was, unless the new one is complete (``CheckpointStore.save``).
        """
        if not self._claimed:
            self._claim(self._check_run())
        super().save(net, trainer, history, epoch, partial)

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
        """Nothing to release: no lock was taken."""

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
    lock = _lock(ckpt.directory, 'wait for it to end', 'leave it')
    try:
        lock.acquire()
    except CheckpointError:
        if lock.held_by is not None:
            raise  # else not a lock of ours: cleaned without one (``release`` does nothing)
    try:
        keep = {e['name'] for e in ckpt._read_manifest()['files'].values()} \
            if ckpt.exists() else set()
        return ckpt._clean(set(), keep)
    except CheckpointError:  # the manifest cannot be read: which files are current is not known
        return []
    finally:
        lock.release()

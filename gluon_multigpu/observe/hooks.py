"""What ``train`` hands its hooks (``Run``), and what a hook may do (``Hook``).

A feature, a checkpoint, a stop on a signal, a progress display: each is a
``Hook`` that lives beside its own code and is called at the points of the
loop named by its methods (see ``training.train``).
"""
from dataclasses import dataclass, field

from ..errors import GluonMultiGPUError
from ..section.results import TrainResult

__all__ = ['Run', 'Hook']


@dataclass
class Run:
    """What hooks see of a run in progress: the network, its Trainer, and where it stands.

    Before the Trainer is made, the hooks' ``setup`` may change how a step
    computes (the features plug in here): ``model`` (what computes: the
    network, or a cast of it), ``split`` (how a batch is shared among the
    devices; ``after_backward`` runs between the backward passes and the
    update, ``eval_split`` splits an evaluation batch), ``scaler`` (loss
    scaling), ``step_scale`` (``trainer.step`` normalises by a batch's samples
    times this) and ``trainer_options`` (arguments of ``kvstores.make_trainer``).
    """
    net: object
    trainer: object
    devices: list
    train_iter: object
    result: TrainResult
    hooks: list
    epoch: int = 0
    test_iter: object = None
    num_epochs: int = 0
    model: object = None
    split: object = None
    after_backward: object = None
    eval_split: object = None
    scaler: object = None
    step_scale: int = 1
    trainer_options: dict = field(default_factory=dict)
    error: object = None  # what ended the last fit, for the hooks' ``leave`` (None: it returned)
    check: object = None  # checks each batch as the loop takes it (``checks.BatchCheck``)
    want_grad_norm: bool = False  # a hook's ``setup`` asks for each update's gradient norm
    steps: object = None  # the epoch in progress (``steps.EpochSteps``): what it has queued

    def call(self, method, *args):
        """Call ``method`` of every hook in turn; return True if any returned True."""
        return any([getattr(hook, method)(self, *args) is True for hook in self.hooks])

    def plug(self, what, value, by):
        """Set ``what`` (``split``, ``model``, ``scaler``) for plug-in ``by``; refuse a second."""
        if getattr(self, what) is not None:
            raise GluonMultiGPUError(f'two hooks set the {what} of the step ({by!r} is the '
                                     'second); pass only one of them')
        setattr(self, what, value)


class Hook:
    """Something added to ``train``'s loop; each method does nothing until overridden.

    ``train`` calls the hooks in the order given. Hooks in the package:
    the features (``balance.Split``, ``precision.MixedPrecision``,
    ``distributed.StepScale``: they plug into the step in ``setup``),
    ``checkpoint.Checkpointer`` (save, resume), ``stopping.StopRequest``
    (stop on SIGINT/SIGTERM/SIGHUP, the scripts'), ``interrupt.Interruptible``
    (Ctrl-C in a notebook or a Python session), ``stall`` (end a deadlocked
    run), ``progress.Progress`` (progress lines), ``live.Live`` (a progress
    display in a notebook), ``metrics.Metrics`` (TensorBoard, JSON lines),
    ``profile.Profile`` (a profile of chosen steps).

    A hook of your own subclasses ``Hook`` and overrides any of the methods; each
    method gets the ``Run`` first. A method that returns True asks to stop where
    its docstring says (``step_end``, ``epoch_end``); other answers are ignored.

    Attributes
    ----------
    handles_signals : bool
        True for a hook that handles SIGINT itself: ``train`` then adds no
        ``Interruptible``. Default False.
    shows_progress : bool
        True for a hook that shows progress: ``train`` then adds no ``Live`` display.
        Default False.
    """

    #: A hook that handles SIGINT itself: ``train`` then adds no ``Interruptible``.
    handles_signals = False
    #: A hook that shows progress: ``train`` then adds no ``Live`` display.
    shows_progress = False

    def setup(self, run):
        """Once, the network initialised (and hybridized), before the Trainer is made.

        A feature plugs into the step here: ``run.plug('split', ...)``,
        ``run.plug('model', ...)``, ``run.plug('scaler', ...)``,
        ``run.step_scale``, ``run.trainer_options`` (see ``Run``).
        """

    def begin(self, run):
        """Before the first epoch, the Trainer made; return ``(first_epoch, partial)`` to resume.

        Called once per ``Training`` (not again when ``fit`` continues it), unless a hook's
        ``begin`` raised: the next ``fit`` then begins again, resuming as the first would have.

        Returns
        -------
        (int, results.EpochTotals or None) or None
            The epoch to begin with and the totals of its batches already done (None: the
            epoch begins at its first batch); None: start at epoch 1. The first hook that
            returns one decides: the hooks after it are not asked.
        """

    def enter(self, run):
        """At the start of every ``fit`` (``train`` calls it once): e.g. install a signal handler."""

    def leave(self, run):
        """At the end of every ``fit``, also when it raises (``run.error``): undo ``enter``."""

    def step_end(self, run, step, samples, timer):
        """After step ``step`` of ``run.epoch`` is queued; return True to stop the epoch there.

        A stop in the epoch's last step (all its batches done, when the data
        has a length) becomes a stop at the epoch's end: it is evaluated and
        recorded first (see ``epoch_end``), so a checkpoint never holds a
        partial epoch that is in fact whole. Nothing has synced: call
        ``npx.waitall()`` before reading ``timer.elapsed()`` to get the devices' time.

        Parameters
        ----------
        run : Run
            The run in progress.
        step : int
            The step's number within the epoch, from 1 (a resumed epoch goes on counting).
        samples : int
            Samples of the epoch's steps queued so far in this fit (a resumed epoch counts
            from where it resumed).
        timer : utils.Timer
            Started when this fit began the epoch (or its rest): ``elapsed()`` in seconds.

        Returns
        -------
        bool or None
            True: stop the epoch after this step (``train`` raises ``Interrupted``).
        """

    def steps_done(self, run):
        """The epoch's queued steps have all finished on the devices (before evaluation)."""

    def stopped(self, run, totals):
        """The epoch was stopped by a hook after ``totals.batches`` steps (all finished).

        Parameters
        ----------
        run : Run
            The run in progress.
        totals : results.EpochTotals
            What the epoch's steps done add up to (loss sum, correct, samples, seconds,
            batches), the part of a resumed epoch done before included.
        """

    def epoch_end(self, run, record):
        """After each epoch is evaluated and recorded in ``run.result``; True stops the run there.

        Every hook's ``epoch_end`` is called (a checkpoint of the epoch is
        written) before the run stops; it stops only if an epoch is left to
        begin (``Interrupted`` with ``epoch_done``); after the last epoch
        ``train`` returns as usual.

        Parameters
        ----------
        run : Run
            The run in progress (``run.epoch`` is the epoch just recorded).
        record : results.EpochRecord
            The epoch's figures (losses, accuracies, seconds, samples).

        Returns
        -------
        bool or None
            True: stop the run after this epoch.
        """

    def diverged(self, run, error):
        """Training diverged: a loss or a parameter became NaN or infinite.

        Parameters
        ----------
        run : Run
            The run in progress.
        error : errors.TrainingDiverged
            The exception ``train`` raises next; a hook may append advice to its
            ``notes`` (a list of str), e.g. which checkpoint is kept.
        """

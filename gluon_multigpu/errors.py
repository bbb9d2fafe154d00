"""Errors that mean "the input is wrong", and the family of stops (``Interrupted``).

The errors: scripts print them as one line and exit 2.

Messages name the library's own arguments in backquotes (`checkpoint_dir`,
`resume=True`); ``describe(names)`` spells them as a caller names them (the
scripts pass their flags), so the library never names a command-line flag.
"""
import re
import signal

__all__ = ['GluonMultiGPUError', 'DeviceError', 'DataError', 'TrainingDiverged', 'CheckpointError',
           'MXNetLoadError',
           'Interrupted', 'StoppedBetweenRuns', 'SweepStopped', 'StoppedBySignal']


class GluonMultiGPUError(ValueError):
    """Base of the package's user-facing errors; the message says what to do next."""

    def describe(self, names=None):
        """The message with each backquoted argument spelled as ``names`` maps it (else as is)."""
        names = names or {}
        return re.sub(r'`([^`]+)`', lambda m: names.get(m.group(1), m.group(1)), str(self))


class DeviceError(GluonMultiGPUError):
    """A device list that cannot be used (missing GPU, empty list, batch too small to split)."""


class DataError(GluonMultiGPUError):
    """Missing, truncated or malformed data files."""


class TrainingDiverged(GluonMultiGPUError):
    """The training loss or a parameter became NaN or infinite.

    ``epoch`` and ``step`` say where, when known (``train`` adds the epoch);
    ``notes`` are advice added on the way up (the learning rate, the checkpoint kept).
    """

    def __init__(self, message, epoch=None, step=None):
        super().__init__(message)
        self.epoch, self.step, self.notes = epoch, step, []

    def __str__(self):
        where = f' in epoch {self.epoch}' if self.epoch is not None else ''
        return super().__str__() + where + ''.join(f'; {note}' for note in self.notes)


class CheckpointError(GluonMultiGPUError):
    """A checkpoint that is damaged, of another run, or cannot be written."""


class MXNetLoadError(GluonMultiGPUError):
    """MXNet cannot load here (not installed, a missing system library, a CUDA build without
    its driver, a NumPy it cannot run on); the message says what to install or set."""


class Interrupted(BaseException):
    """A run stopped on request: the base of the package's stops (training's own, as below).

    The package raises one of this family wherever a stop request ends work:
    ``Interrupted`` itself when ``train`` stops after a step (a hook's
    ``step_end`` or ``epoch_end``: Ctrl-C in a notebook, a script's signal),
    ``StoppedBetweenRuns`` between two runs of a comparison, ``SweepStopped``
    when a measuring program's sweep stops, and ``StoppedBySignal`` where a
    signal handler raises it in the middle of the code. ``signum`` is the
    signal that caused the stop (None: a hook's or a launcher's request).

    (More: docs/design.md, "Notes on the code".)
    """

    epoch = batches = training = signum = None
    epoch_done = False

    def __init__(self, epoch=None, batches=None, epoch_done=False, training=None, *, signum=None,
                 message=None):
        if message is None:
            where = (f'after epoch {epoch}, before the next began' if epoch_done else
                     f'in epoch {epoch} after {batches} batch(es)')
            more = ('; the run is kept: gm.last_run().fit() goes on from there'
                    if training is not None else '')
            message = f'interrupted {where}{more}'
        super().__init__(message)
        self.epoch, self.batches, self.epoch_done = epoch, batches, epoch_done
        self.training, self.signum = training, signum

    def _render_traceback_(self):
        """What IPython shows for it in a notebook: the one line, not a traceback."""
        return [f'{type(self).__name__}: {self}']


class StoppedBetweenRuns(Interrupted):
    """A stop at the end of an epoch of a comparison's runs (taken in turn): no other is begun.

    ``done`` names the epoch that finished last (``epoch 2 of kvstore
    local``), ``left`` what was not begun, in words; ``num_epochs`` is the last
    round every run finished.
    """

    def __init__(self, num_epochs, done, left, signum=None):
        super().__init__(num_epochs, None, epoch_done=True, signum=signum)
        self.done, self.left = done, left


class SweepStopped(Interrupted):
    """A measuring program's sweep stopped by a signal: ``sweep`` keeps what it measured."""

    def __init__(self, sweep, signum):
        super().__init__(signum=signum, message='stopped')
        self.sweep = sweep


class StoppedBySignal(Interrupted):
    """A stop raised where the code was: by a signal handler (``signals.raising``), or where
    work asks a stop request between its steps (``measure.check_stop``)."""

    def __init__(self, signum):
        super().__init__(signum=signum, message=f'interrupted by {signal.Signals(signum).name}')

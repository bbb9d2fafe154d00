"""Errors that mean "the input is wrong": scripts print them as one line and exit 2.

Messages name the library's own arguments in backquotes (`checkpoint_dir`,
`resume=True`); ``describe(names)`` spells them as a caller names them (the
scripts pass their flags), so the library never names a command-line flag.
"""
import re

__all__ = ['GluonMultiGPUError', 'DeviceError', 'DataError', 'TrainingDiverged', 'CheckpointError',
           'Interrupted']


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


class Interrupted(Exception):
    """Training stopped on request (a hook's ``step_end`` or ``epoch_end``) after a step.

    Attributes
    ----------
    epoch, batches : int
        The epoch in progress and how many of its batches had finished.
    epoch_done : bool
        The request came at the epoch's end (in its last step or its
        evaluation): the epoch is complete, evaluated and recorded, and the
        next one was not begun.
    training : training.Training or None
        The run, intact: ``training.fit()`` goes on from where it stopped,
        ``training.result`` holds the epochs done.
    """

    def __init__(self, epoch, batches, epoch_done=False, training=None):
        where = (f'after epoch {epoch}, before the next began' if epoch_done else
                 f'in epoch {epoch} after {batches} batch(es)')
        more = ('; the run is kept: gm.last_run().fit() goes on from there' if training is not None
                else '')
        super().__init__(f'interrupted {where}{more}')
        self.epoch, self.batches, self.epoch_done = epoch, batches, epoch_done
        self.training = training

    def _render_traceback_(self):
        """What IPython shows for it in a notebook: the one line, not a traceback."""
        return [f'Interrupted: {self}']

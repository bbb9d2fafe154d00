"""Errors that mean "the input is wrong": scripts print them as one line and exit 2."""

__all__ = ['GluonMultiGPUError', 'DeviceError', 'DataError', 'TrainingDiverged', 'CheckpointError',
           'Interrupted']


class GluonMultiGPUError(ValueError):
    """Base of the package's user-facing errors; the message says what to do next."""


class DeviceError(GluonMultiGPUError):
    """A device list that cannot be used (missing GPU, empty list, batch too small to split)."""


class DataError(GluonMultiGPUError):
    """Missing, truncated or malformed data files."""


class TrainingDiverged(GluonMultiGPUError):
    """The training loss or a parameter became NaN or infinite.

    ``epoch`` and ``step`` say where, when known (``fit`` adds the epoch).
    """

    def __init__(self, message, epoch=None, step=None):
        super().__init__(message)
        self.epoch, self.step = epoch, step


class CheckpointError(GluonMultiGPUError):
    """A checkpoint that is damaged, of another run, or cannot be written."""


class Interrupted(Exception):
    """Training stopped on request (SIGINT, SIGTERM) after a step; a checkpoint may hold its state.

    Attributes
    ----------
    signum : int or None
        The signal that asked for the stop.
    epoch, batches : int
        The epoch in progress and how many of its batches had finished.
    checkpoint : str or None
        Directory of the checkpoint written at the stop, if any.
    """

    def __init__(self, signum, epoch, batches, checkpoint=None):
        super().__init__(f'interrupted in epoch {epoch} after {batches} batch(es)')
        self.signum, self.epoch, self.batches, self.checkpoint = signum, epoch, batches, checkpoint

"""Errors that mean "the input is wrong": scripts print them as one line and exit 2."""

__all__ = ['GluonMultiGPUError', 'DeviceError', 'DataError', 'TrainingDiverged']


class GluonMultiGPUError(ValueError):
    """Base of the package's user-facing errors; the message says what to do next."""


class DeviceError(GluonMultiGPUError):
    """A device list that cannot be used (missing GPU, empty list, batch too small to split)."""


class DataError(GluonMultiGPUError):
    """Missing, truncated or malformed data files."""


class TrainingDiverged(GluonMultiGPUError):
    """The training loss became NaN or infinite."""

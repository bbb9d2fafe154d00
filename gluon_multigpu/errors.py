"""Errors that mean "the input is wrong", and the one stop exception (``Interrupted``).

The errors: scripts print them as one line and exit 2.

Messages name the library's own arguments in backquotes (`checkpoint_dir`,
`resume=True`); ``describe(names)`` spells them as a caller names them (the
scripts pass their flags), so the library never names a command-line flag.
"""
import re
import signal

__all__ = ['flag', 'GluonMultiGPUError', 'DeviceError', 'DataError', 'TrainingDiverged',
           'CheckpointError', 'MXNetLoadError', 'Interrupted', 'SettingWarning']


def flag(name):
    """How a command line spells the argument ``name`` (``resume=True``: ``--resume``)."""
    return '--' + name.split('=')[0].replace('_', '-')


class GluonMultiGPUError(ValueError):
    """Base of the package's user-facing errors; the message says what to do next."""

    def describe(self, names=None):
        """The message with each backquoted argument spelled as ``names`` says: a mapping (a
        name it lacks stays as is) or a function such as ``flag`` (a command line's spelling).
        """
        spell = names if callable(names) else (lambda name: (names or {}).get(name, name))
        return re.sub(r'`([a-z_]+(?:=True)?)`', lambda m: spell(m.group(1)), str(self))


class SettingWarning(UserWarning):
    """A setting that works but does not do what it says in this run (a warm-up as long as
    the run); the command line prints it as one line, its arguments as flags."""

    describe = GluonMultiGPUError.describe


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
    """A stop was asked, and work ended on it: the package's one stop exception.

    Raised wherever a stop request ends work: when ``train`` stops after a
    step (Ctrl-C in a notebook, a script's signal), between the epochs of a
    comparison (``between_runs``), when a sweep of measurements stops (its
    ``sweep``), where a signal handler raises it in the middle of
    the code (``by_signal``), and while a worker waits to join the parameter
    server (``joining``). ``str(e)`` is the reason, in one line. A
    ``BaseException``, as ``KeyboardInterrupt`` is: a stop is a request, not a
    failure, and an ``except Exception`` that handles failures must not swallow
    it. Catch it by name: ``except gm.Interrupted``.

    Attributes
    ----------
    epoch, batches : int or None
        The epoch in progress and how many of its batches had finished.
    epoch_done : bool
        The request came at the epoch's end (in its last step or its evaluation): the
        epoch is complete, evaluated and recorded, and the next one was not begun.
    training : training.Training or None
        The run, intact: ``training.fit()`` goes on from where it stopped,
        ``training.result`` holds the epochs done.
    signum : int or None
        The signal that asked (None: a hook's or a launcher's request).
    """

    #: ``joining``: asked while a worker waited to join the parameter server; ``now``: a second
    #: request, which ends the process without the first one's clean stop.
    epoch_done = joining = now = False
    #: ``done`` and ``left``: a comparison's stop, the epoch that finished last and what was not
    #: begun, in words; ``comparison``: a comparison's stop, once it kept what its kvstores
    #: measured (``Comparison.kept``); ``sweep``: a measuring program's stop, its sweep, which
    #: keeps what it measured.
    epoch = batches = training = signum = done = left = sweep = comparison = None

    def __init__(self, epoch=None, batches=None, epoch_done=False, training=None, *, signum=None,
                 message=None, **details):
        if message is None:
            where = (f'after epoch {epoch}, before the next began' if epoch_done else
                     f'in epoch {epoch} after {batches} batch(es)')
            kept = '; the run is kept: gm.last_run().fit() goes on from there'
            message = f'interrupted {where}{kept if training is not None else ""}'
        super().__init__(message)
        for name, value in dict(details, epoch=epoch, batches=batches, epoch_done=epoch_done,
                                training=training, signum=signum).items():
            if not hasattr(type(self), name):
                raise TypeError(f'Interrupted has no detail {name!r}')
            setattr(self, name, value)

    @classmethod
    def by_signal(cls, signum):
        """Raised where the code was: by a signal handler (``signals.raising``), or where work
        asks a stop request between its steps (the lab's ``sweep.check_stop``)."""
        return cls(signum=signum, message=f'interrupted by {signal.Signals(signum).name}')

    @classmethod
    def between_runs(cls, num_epochs, done, left, signum=None):
        """A comparison's stop at the end of an epoch of its runs (taken in turn): ``done`` names
        the epoch that finished last, ``left`` what was not begun; ``num_epochs`` is the last
        round every run finished."""
        return cls(num_epochs, None, epoch_done=True, signum=signum, done=done, left=left)

    def _render_traceback_(self):
        """What IPython shows for it in a notebook: the one line, not a traceback."""
        return [f'{type(self).__name__}: {self}']

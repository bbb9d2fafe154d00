"""What the programs say when they stop: on a signal, at a second one, or on a failed write.

One place for the wording of every stop of the command line (train's, the
measuring programs', the start-up's), so that the same event reads the same
in every program: a first signal is acknowledged at once with what happens
next (``heard``), a second says that the process ends now, and the last line
says where the run stopped, what was kept and how to go on. The functions
make the text; the programs print it (``say_quietly``) and choose the exit
status (128 + the signal). The lines the library's runs say too
(``comparison_why``, ``launcher_stops``) are ``stopping``'s. Nothing here loads MXNet.
"""
import signal

from ..observe.stopping import comparison_why, launcher_stops, say_quietly, signal_name  # noqa: F401


def heard(signum, launched=False):
    """How the first line names a signal: ``Ctrl-C``, ``SIGHUP (the terminal closed)``, ``SIGTERM``.

    A worker of the launcher (``launched``) has no terminal: its signals come
    from the launcher, and the line says so.
    """
    return f'{signal_name(signum)} from the launcher' if launched else {
        signal.SIGINT: 'Ctrl-C', signal.SIGHUP: 'SIGHUP (the terminal closed)'}.get(
            signum, signal_name(signum))


# -- train --------------------------------------------------------------------------------------

def train_heard(signum, book=False, launched=False, joining=False):
    """The line at once on a first signal: the run stops after the current step.

    The text's loop (``book``) queues steps ahead of the devices without a
    bound, up to an epoch's end: it stops after the steps already queued.
    Nobody can press Ctrl-C for a worker of the launcher (``launched``).
    """
    name = heard(signum, launched)
    if joining:
        return f'{name}: stopping while joining the parameter server'
    when = ("once the steps already queued have run (the text's loop queues them ahead of the "
            "devices, up to the epoch's end)" if book else 'after the current step')
    return f'{name}: stopping {when}' + ('' if launched else '; Ctrl-C again to stop now')


def train_stopped_now(kept=None):
    """The line before a second signal ends a training run at once; ``kept`` names what is
    left (the checkpoint), None: nothing is said of it."""
    return 'stopped at once (a second signal)' + (f': {kept}' if kept else '')


def train_stopped(signum, error, resume=None, checkpoint=None, kept=None, by_rank_0=False,
                  saved=True):
    """The last line of a training run stopped by ``error`` (an ``Interrupted``).

    Where it stopped; then what a stopped comparison kept (``kept``, from
    ``Comparison.kept``), or the ``checkpoint`` folder and the ``resume``
    command (``by_rank_0``: a parameter-server worker after the first, whose
    first worker keeps it; not ``saved``: the folder holds nothing yet), or
    that nothing can be resumed.
    """
    name = signal_name(signum)
    if getattr(error, 'left', None) is not None:  # Interrupted.between_runs
        where = f"interrupted by {name} at the end of {getattr(error, 'done', None)}"
        if error.left:
            where += f': {kept_and_written(error.left)} not begun'
    else:
        when = (f'after epoch {error.epoch} had finished its steps, before epoch '
                f'{error.epoch + 1} began' if error.epoch_done else
                f'in epoch {error.epoch} after {error.batches} batch(es)')
        where = (f'interrupted by {name} during {kept[1]} ({when})'
                 if kept is not None and kept[1] is not None else f'interrupted by {name} {when}')
    if kept is not None:
        return f'{where}; {comparison_kept(kept[0], kept[2])}'
    if checkpoint is not None and not saved:  # stopped before the first save
        return (f'{where}; nothing was saved in {checkpoint} yet: the same command starts the '
                'run again from the beginning')
    if checkpoint is not None and by_rank_0:  # a worker after the first saves none
        return f'{where}; rank 0 keeps the checkpoint in {checkpoint}; resume with: {resume}'
    return (f'{where}; checkpoint in {checkpoint}; resume with: {resume}' if checkpoint is not None
            else f'{where}; no checkpoint written (add --checkpoint-dir DIR to be able to resume)')


def comparison_kept(measured, written):
    """What a stopped comparison kept: the epochs ``measured`` (in words, None for none), and
    where they were ``written``."""
    if not measured:
        return 'no epoch had finished: no output was written'
    if not written:
        return f'the results of {measured} are printed above (no output was asked for)'
    return f'the results of {measured} are kept, marked partial, in {kept_and_written(written)}'


def kept_and_written(paths):
    """``a``, ``a and b``, ``a, b and c``."""
    return ', '.join(paths[:-1]) + ' and ' + paths[-1] if len(paths) > 1 else paths[0]


def train_finished_anyway(signum, outputs=False, checkpoint=False):
    """The last line for a signal that came after the last step: the run finished all the same."""
    done = [words for words, said in (('the run is complete', True),
                                      ('its outputs are written', outputs),
                                      ('its checkpoint holds it', checkpoint)) if said]
    return (f'{signal_name(signum)} came after the last step: {kept_and_written(done)}; exit '
            f'status {128 + signum}, as for any stop by a signal')


# -- the launcher (its lines go out as ``launch: ...``) -----------------------------------------

def launch_heard(signum, grace):
    """The line at once on a first signal: the job stops in order, within ``grace`` seconds."""
    return (f'{signal_name(signum)}: stopping the job: the workers finish a step (the same for '
            f'all) and write their checkpoint (up to {grace:g} s); Ctrl-C again to stop every '
            'process at once')


def launch_stopped_now(signum):
    """The line of a second signal while the job stops: every process is killed at once."""
    return f'{signal_name(signum)} again: killing every process now'


def launch_stopped(signum):
    """The line once a job stopped in order by ``signum`` has no process left."""
    return f'stopped by {signal_name(signum)}: every process has ended'


def launch_not_started():
    """The line of a signal that came before any process of the job was started."""
    return 'interrupted: no process was started'


def launch_resume(command):
    """The last line of a job stopped by a signal whose workers keep checkpoints."""
    return f'resume with: {command}'


# -- any program ------------------------------------------------------------------------------

def nothing_written(error):
    """The last line of a program stopped where its code was (``Interrupted.by_signal``)."""
    return f'{error}: nothing was written'


def while_starting(signum, began):
    """The line of a signal before the program's own handlers (``began``: after them)."""
    return (f'{signal_name(signum)} came as the run was ending: its results are as printed'
            if began else 'interrupted while starting: nothing was written')


def could_not_write(error, kept):
    """The line of a write that failed (``OSError``); ``kept`` says what is left as it was."""
    where = f' {error.filename}' if error.filename else ''
    return (f'error: could not write{where}: {error.strerror or error}; free space or choose '
            f'another place ({kept})')


#: Every function above, and those of ``stopping`` this module names too (not ``signal``).
__all__ = [name for name in dir() if not name.startswith('_') and name != 'signal']

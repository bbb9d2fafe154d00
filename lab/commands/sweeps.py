"""The main of the measuring programs that keep every measurement as it is made, and their words.

``sweep_main``: a program that keeps every measurement in a results file as
it is made (``measure_sweep``): a first signal stops after the current step
and says what was kept and how to continue; a second ends the process at
once. The programs that keep nothing end through ``console.stopping_main``.
Nothing here loads MXNet before a run needs it.
"""
import math
import os
import signal
import sys

from gluon_multigpu.cli import messages
from gluon_multigpu.cli.messages import heard, signal_name
from gluon_multigpu.cli.arguments import UsageError, error_line
from gluon_multigpu.cli.console import quiet_console, resume_command, say_quietly, stop_request
from gluon_multigpu.base import signals
from gluon_multigpu.errors import GluonMultiGPUError, Interrupted
from lab.studies.sweep import check_stop

#: An environment variable the measuring programs read instead of the system's MemAvailable,
#: in bytes (e.g. ``2e9``): to try, or test, how they answer on a machine with less memory.
MEMORY_VARIABLE = 'GLUON_MULTIGPU_MEMORY_AVAILABLE'


# -- what the measuring programs say when they stop ---------------------------------------------

def sweep_heard(signum):
    """The line at once on a first signal: every measurement finished is kept."""
    return (f'{heard(signum)}: stopping after the current step; every measurement finished is '
            'kept (Ctrl-C again to stop now)')


def sweep_stopped_now(sweep=None, whole=True):
    """The line before a second signal ends a measuring program at once.

    ``sweep``: the sweep measured (None: not begun); ``whole``: whether its
    results file was complete when the process let go of it.
    """
    if sweep is None:
        return ('stopped at once (a second signal): the measurements finished before are kept '
                'in the results file')
    if not sweep.done:
        return ('stopped at once (a second signal): nothing had been measured yet, nothing was '
                'written')
    kept = 'complete' if sweep.complete else 'marked partial'
    return (f'stopped at once (a second signal): {sweep.describe()} ({kept})'
            + ('' if whole else '; a write of it was still in progress: it holds the '
               'measurements before the last'))


def sweep_stopped(signum, sweep, command):
    """The last line of a measuring run stopped by a signal: what it kept, how to go on."""
    name = signal_name(signum)
    if sweep is None or not sweep.done:
        return f'interrupted by {name}: nothing had been measured yet, nothing was written'
    return f'interrupted by {name}: {sweep.describe()} (marked partial); continue with: {command}'


def sweep_kept(path):
    """The last line of a measuring program that finished: where its measurements are."""
    return (f'the measurements are kept in {path}: --resume reuses them, --overwrite measures '
            'again')


def sweep_finished_anyway(signum):
    """The last line for a signal after the last measurement: the run is complete."""
    return (f'{signal_name(signum)} came after the last measurement: the run is complete and '
            f'written; exit status {128 + signum}')


def partial_heading(sweep):
    """The line above a partial table."""
    return f'partial results (interrupted): {len(sweep.done)} of {len(sweep.units)} measurements'


def available_memory(environ=None):
    """Bytes of memory a measuring program may use: ``MEMORY_VARIABLE`` if set, else the
    system's (``devices.available_memory``: MemAvailable plus what this process holds);
    None where the system does not say."""
    environ = os.environ if environ is None else environ
    text = environ.get(MEMORY_VARIABLE)
    if text:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f'{MEMORY_VARIABLE}={text!r} is not a positive number of bytes')
        return value
    from gluon_multigpu.section import devices  # pylint: disable=import-outside-toplevel  (loads MXNet)
    return devices.available_memory()


def data_root(args, dataset='fashion-mnist'):
    """The data folder of ``args`` (--data-dir, or the data set's default), its files downloaded
    first with --download and checked (``DataError``: one line naming what to do)."""
    from gluon_multigpu.section import data  # pylint: disable=import-outside-toplevel  (loads MXNet)
    root = os.path.expanduser(args.data_dir or data.default_root(dataset))
    if args.download:
        data.download_dataset(dataset, root)
    data.check_data_dir(root)
    return root


def in_out_folder(results, out):
    """Whether the results file ``results`` is in the folder ``out`` itself (None: no)."""
    return results is not None and out is not None and \
        os.path.realpath(os.path.dirname(os.path.abspath(results))) == os.path.realpath(out)


def results_output(results, out, report_files):
    """What ``targets.check_outputs`` checks of --results beside --out: ``[('--results', path)]``.

    --results in the --out folder itself is where the run keeps it by
    default (``DIR/results.json``): allowed, unless it takes the name of one
    of ``report_files`` (the report would replace it); the folder's own
    check covers it then. Anywhere else, --results is checked as a file of its
    own. None: nothing to check.
    """
    if results is None:
        return []
    if in_out_folder(results, out):
        if os.path.basename(results) in report_files:
            raise GluonMultiGPUError(f'`results` {results} takes the name of a file of the report '
                                     f'written into --out {out}; give it another name, e.g. '
                                     f'{os.path.join(out, "results.json")}')
        return []
    return [('--results', results)]


#: The sweep being measured (``measure_sweep``): a second signal lets go of its results file.
_ACTIVE = {'sweep': None, 'kept': None}  # the sweep measuring, the results file of the last


def _stop_now(signum):  # pylint: disable=unused-argument
    """Before a second signal ends the process (``StopRequest``, from its thread)."""
    sweep = _ACTIVE['sweep']
    if sweep is None:
        say_quietly(sweep_stopped_now())
        return
    whole = sweep.abandon()  # waits for a write of the results file in progress
    say_quietly(sweep_stopped_now(sweep, whole))


def measure_sweep(sweep, measure, stop, show_partial):
    """Measure the pending units of ``sweep`` with ``measure(unit)``; return its results.

    ``stop`` is asked before every unit; when it stops the run (any
    ``Interrupted``: raised between steps, or training's own after
    one), ``show_partial(results)`` prints what was measured, and an
    ``Interrupted`` that keeps the ``sweep`` is raised.
    """
    _ACTIVE['sweep'] = sweep
    try:
        with sweep:
            for unit in sweep.pending():
                check_stop(stop)  # before its first line: nothing begins after a stop
                sweep.begin(unit)
                sweep.keep(unit, measure(unit))
            _ACTIVE['kept'] = sweep.path
            return sweep.results()
    except Interrupted as e:
        signum = stop.signum or e.signum or signal.SIGINT
        if sweep.done:
            show_partial(sweep.results())
        raise Interrupted(signum=signum, message='stopped', sweep=sweep) from None
    finally:
        sweep.close()  # also when ``with`` was never reached


def sweep_main(argv, make_parser, run_script, name):
    """The ``main`` of a measuring program that keeps its results as it goes; its exit status.

    ``run_script(args, stop)`` measures, asking ``stop`` (a ``StopRequest``)
    between steps, and raises ``Interrupted`` (with its ``sweep``) when it stopped. Ctrl-C,
    SIGTERM or SIGHUP: one line at once, the current step ends, the partial
    table is printed (by ``run_script``), one line says what was kept and how
    to continue, status 128 + the signal; a second signal ends the process at
    once (the results file keeps what was finished). Bad input: one line, 2;
    a write that fails: one line, 1. Done: one line names the results file.
    """
    args = make_parser().parse_args(argv)
    signals.ignore((signal.SIGXFSZ,))
    _ACTIVE['kept'] = None
    with quiet_console():
        try:
            with stop_request(lambda signum: say_quietly(sweep_heard(signum)),
                              _stop_now) as stop:
                run_script(args, stop=stop)
        except Interrupted as e:
            signum = e.signum or stop.signum or signal.SIGINT
            say_quietly(sweep_stopped(signum, e.sweep, resume_command(name, argv)))
            return 128 + signum
        except GluonMultiGPUError as e:
            say_quietly(error_line(e))
            return 2
        except UsageError as e:
            say_quietly(f'error: {e}')
            return 2
        except OSError as e:
            say_quietly(messages.could_not_write(
                e, 'the results file keeps what was measured before'))
            return 1
        if _ACTIVE['kept']:  # every program says where its measurements are
            say_quietly(sweep_kept(_ACTIVE['kept']))
        if stop.signum:  # after the last measurement: the run is complete
            say_quietly(sweep_finished_anyway(stop.signum))
            return 128 + stop.signum
    return 0


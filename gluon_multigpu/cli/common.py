"""What the programs share: the argument parser and types, the engine set-up, the error handling.

MXNet reads some of its settings once, when its library loads (``OMP_NUM_THREADS``)
or when its engine first needs scratch space (``MXNET_CPU_TEMP_COPY``). So a
program first reads its device flags and calls ``prepare_engine``, which has
``gluon_multigpu.base.engine`` compute and set them, and only then uses
anything of the package that loads MXNet. Nothing in this module loads MXNet.

The library names its arguments in backquotes (`checkpoint_dir`); ``FLAGS``
spells them as this command line does (``error_line``).
"""
import argparse
import math
import os
import shlex
import signal
import sys

from ..base import engine
from ..run import files

#: Most CPU contexts a script accepts: MXNet starts a worker thread per
#: context, and past this many the contexts only share the same cores.
MAX_CPU_DEVICES = 64
#: Most GPUs a script accepts (MXNet's peer-to-peer code assumes far fewer).
MAX_GPUS = 64
#: Largest seed: MXNet's generator takes a 32-bit unsigned seed.
MAX_SEED = 2**32 - 1


class UsageError(Exception):
    """A bad command line or environment: one line, exit status 2."""


def cores():
    """The CPU cores this process may run on."""
    return engine.cores()


def apply_engine_settings(num_cpu_devices=None, environ=None, sync_bn=False):
    """``gm.engine.configure`` for a script: a bad engine variable is a ``UsageError``.

    Call before MXNet loads; returns the variables set now.
    """
    try:
        return engine.configure(num_cpu_devices, sync_bn=sync_bn, environ=environ)
    except engine.EngineError as e:
        raise UsageError(e.describe(FLAGS)) from None


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` that reports a bad argument in one line (no usage block), status 2.

    Flags must be written in full (no ``--sync`` for ``--sync-bn``): the
    engine settings are chosen from the command line before this parser
    runs, by the full names.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault('allow_abbrev', False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f'{self.prog}: error: {message} (see --help)\n')


def _number(text, kind, low, high, wanted, above_low=False):
    """Parse ``text`` as ``kind`` in ``[low, high]`` (``(low, high]`` with ``above_low``).

    Raises ``ArgumentTypeError`` saying what is wrong and what to give instead.
    """
    try:
        value = kind(text)
    except ValueError:
        noun = 'an integer' if kind is int else 'a number'
        raise argparse.ArgumentTypeError(f'{text!r} is not {noun}; give {wanted}') from None
    if kind is float and not (math.isfinite(value) and value >= low and
                              not (above_low and value == low)):
        problem = ('is not a positive finite number' if above_low else
                   f'is not a finite number of {low:g} or more')
    elif value < low:
        problem = {0: 'is negative', 1: 'is not positive'}.get(low, f'is below {low}')
    elif value > high:
        problem = f'is above {high}' if kind is int else f'is above {high:g}'.replace('e+0', 'e')
    else:
        return value
    raise argparse.ArgumentTypeError(f'{text} {problem}; give {wanted}')


def int_in(low, high):
    """argparse type: a whole number from ``low`` to ``high``."""
    def parse(text):
        return _number(text, int, low, high, f'a whole number from {low} to {high}')
    parse.__name__ = 'integer'
    return parse


def positive_float(text):
    """argparse type: a number greater than 0, at most 1e6."""
    return _number(text, float, 0, 1e6, 'a number greater than 0 and at most 1e6', True)


def non_negative_float(text):
    """argparse type: a number from 0 to 1e6."""
    return _number(text, float, 0, 1e6, 'a number from 0 to 1e6')


def path_of(kind):
    """argparse type: a path that is not empty (``''`` would mean the current folder, or none).

    ``kind`` says what to give instead ("a directory", "a file name").
    """
    def parse(text):
        if not text.strip():
            raise argparse.ArgumentTypeError(f'{text!r} is an empty path; give {kind}')
        return text
    parse.__name__ = 'path'
    return parse


#: Samples per batch, epochs: more than any run here could use, small enough to stay exact.
batch_size = int_in(1, 10**6)
num_epochs = int_in(1, 10**5)
seed = int_in(0, MAX_SEED)


def split_weights(text):
    """argparse type of --split: ``even`` (None), ``auto``, or positive weights ``W1,W2,...``."""
    if text == 'even':
        return None
    if text == 'auto':
        return text
    try:
        weights = [float(w) for w in text.split(',')]
    except ValueError:
        weights = []
    if not weights or not all(math.isfinite(w) and 0 < w <= 1e6 for w in weights):
        raise argparse.ArgumentTypeError(f'{text!r} is neither even, auto nor positive weights; '
                                         'give even, auto or one weight per device, e.g. 1,3')
    return weights


def add_device_flags(p, gpu_help, cpu_help):
    """Add the mutually exclusive ``--num-gpus``/``--cpu-devices`` pair to parser ``p``."""
    where = p.add_mutually_exclusive_group()
    where.add_argument('--num-gpus', type=int_in(1, MAX_GPUS), metavar='N', help=gpu_help)
    where.add_argument('--cpu-devices', type=int_in(1, MAX_CPU_DEVICES), metavar='N',
                       help=cpu_help)
    return where


def add_run_flags(p, models, datasets, seed_help='the same in every run'):
    """Add what a training run is made of: --model, --dataset, --data-dir, subsets and --seed.

    ``models`` and ``datasets`` are the choices (the package's names).
    """
    p.add_argument('--model', choices=list(models), default='resnet18',
                   help='network (default: resnet18)')
    p.add_argument('--dataset', choices=list(datasets), default='fashion-mnist',
                   help='data set (default: fashion-mnist)')
    p.add_argument('--data-dir', metavar='DIR', type=path_of('a directory'),
                   help='directory with the four IDX .gz files '
                   '(default: ~/.mxnet/datasets/<dataset>)')
    p.add_argument('--num-train', type=int_in(1, 10**8), metavar='N',
                   help='use only the first N training images (default: all 60000)')
    p.add_argument('--num-test', type=int_in(1, 10**8), metavar='N',
                   help='use only the first N test images (default: all 10000)')
    p.add_argument('--seed', type=seed, default=0,
                   help=f'seed of the initial weights and the data order, 0 to {MAX_SEED}, '
                   f'{seed_help} (default: 0)')


def sweep_parser(doc, epilog, first, cpu_default, what):
    """A parser for a script that sweeps device counts ``first``, 2 x ``first``, ... up to N.

    ``cpu_default`` says what it sweeps without GPUs and flags; ``what`` ends
    the help of ``--counts`` ("device counts to ...").
    """
    counts = f'counts {first}, {2 * first if first > 1 else 2}, ... up to N and N'
    p = script_parser(doc, epilog, f'GPUs, {counts} (default: all GPUs)',
                      f'CPU contexts, {counts} (default without GPUs: {cpu_default})')
    p.add_argument('--counts', type=int_in(1, MAX_CPU_DEVICES), nargs='+', metavar='N',
                   help=f'device counts to {what} (default: see above)')
    return p


def script_parser(doc, epilog, gpu_help, cpu_help):
    """A ``OneLineParser`` for a script, with its ``--num-gpus``/``--cpu-devices`` pair.

    ``doc`` is the script's docstring (its first line describes it), ``epilog``
    ends ``--help``; the two help texts say what the device flags mean there.
    """
    p = OneLineParser(description=doc.splitlines()[0], epilog=epilog,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_flags(p, gpu_help, cpu_help)
    return p


class _QuietParser(argparse.ArgumentParser):
    """A parser that raises ``UsageError`` instead of printing and exiting (no abbreviations)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        raise UsageError(message)


def engine_devices(argv):
    """How many CPU contexts a command line trains on side by side; None if not known.

    Reads only the device flags (the full parser needs the package, which
    needs the settings first); a bad value is left for the full parser.
    """
    p = _QuietParser(add_help=False)
    add_device_flags(p, None, None)
    try:
        args, _ = p.parse_known_args(argv)
    except UsageError:
        return None
    if args.cpu_devices is not None:
        return args.cpu_devices
    if args.num_gpus is not None:
        return 0
    # Neither flag: all GPUs, or one CPU context when there are none (no NVIDIA
    # device node: MXNet would find no GPU either).
    return None if os.path.exists('/dev/nvidiactl') else 1


#: The signals that stop a run: Ctrl-C, SIGTERM, and SIGHUP (the terminal or ssh session closed).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def say_quietly(line, stream=None):
    """Print ``line`` on ``stream`` (stderr) and flush; a terminal that is gone is not an error."""
    try:
        print(line, file=stream or sys.stderr, flush=True)
    except (OSError, ValueError):  # EIO (a closed terminal), EPIPE; ValueError: stream closed
        pass


_RUN = {'began': False}


def run_began():
    """Say that the script's own handlers are in place: the pre-load ones act again only after."""
    _RUN['began'] = True


def _stopped_while_starting(signum, frame):  # pylint: disable=unused-argument
    if _RUN['began']:  # the script's handlers are gone again: the run has ended
        say_quietly(f'{signal.Signals(signum).name} came as the run was ending: its results are '
                    'as printed')
    else:
        say_quietly('interrupted while starting: nothing was written')
    files.discard_unfinished()
    os._exit(128 + signum)  # pylint: disable=protected-access


def prepare_engine(argv=None):
    """The first thing a script does: engine settings for its device flags, before MXNet loads.

    A bad engine variable ends the process with one line and status 2. Until
    the script installs its own handlers, Ctrl-C, SIGTERM or SIGHUP (while
    MXNet loads, which takes seconds) ends it with one line, not a traceback;
    SIGHUP ignored at start (``nohup``) stays ignored.
    """
    for signum in STOP_SIGNALS:
        if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:  # nohup
            signal.signal(signum, _stopped_while_starting)
    _RUN['began'] = False
    argv = sys.argv[1:] if argv is None else argv
    try:
        apply_engine_settings(engine_devices(argv), sync_bn='--sync-bn' in argv)
    except UsageError as e:
        say_quietly(f'error: {e}')
        sys.exit(2)


class _QuietStream:
    """A console stream whose write errors end its output, not the run.

    A terminal that closed (EIO) or a reader that went away (EPIPE) would
    turn the next progress line into an exception. On the first failure the
    stream's descriptor is pointed at the null device, so that what is still
    buffered, and Python's flush at exit, go nowhere quietly.
    """

    def __init__(self, stream):
        self._stream, self.lost = stream, False

    def _lose(self):
        self.lost = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):
            pass  # no descriptor of its own (a test's capture): dropping the text is enough

    def write(self, text):
        if not self.lost:
            try:
                self._stream.write(text)
            except (OSError, ValueError):
                self._lose()
        return len(text)

    def flush(self):
        if not self.lost:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._lose()

    def __getattr__(self, name):
        return getattr(self._stream, name)


class quiet_console:  # pylint: disable=invalid-name
    """Within the block, ``sys.stdout`` and ``sys.stderr`` never raise on a closed terminal."""

    def __enter__(self):
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _QuietStream(sys.stdout), _QuietStream(sys.stderr)
        return self

    def __exit__(self, *exc):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = self._saved
        return False


#: How the library's argument names read on the command line (see ``GluonMultiGPUError``).
FLAGS = {'cpu_devices': '--cpu-devices', 'num_gpus': '--num-gpus',
         'checkpoint_dir': '--checkpoint-dir', 'resume=True': '--resume',
         'overwrite=True': '--overwrite',
         'num_epochs': '--num-epochs', 'data_dir': '--data-dir', 'download=True': '--download',
         'dataset': '--dataset', 'batch_size': '--batch-size', 'num_train': '--num-train',
         'lr': '--lr', 'counts': '--counts', 'kvstore': '--kvstore',
         'global_batch': '--global-batch', 'dtype': '--dtype', 'split': '--split',
         'sync_bn': '--sync-bn', 'model': '--model', 'book_literal': '--book-literal',
         'batch_per_device': '--batch-per-device', 'results': '--results', 'quick': '--quick',
         'models': '--models', 'steps': '--steps', 'rounds': '--rounds',
         'num_test': '--num-test', 'project_to': '--project-to'}


def error_line(error):
    """The one line printed for a ``GluonMultiGPUError``: its message with the CLI's flag names."""
    return f'error: {error.describe(FLAGS)}'


def run_main(argv, build_parser, run):
    """The ``main`` of a measuring program; return its exit status.

    Parses ``argv`` and calls ``run(args)``: 0 when done, 2 with one line for
    bad input, 130 when interrupted.
    """
    from gluon_multigpu.errors import GluonMultiGPUError
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except GluonMultiGPUError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('interrupted', file=sys.stderr)
        return 130
    return 0


def stopping_main(argv, make_parser, run_script):
    """``run_main`` that also ends cleanly on a signal and on a failed write; the status.

    The main of every program but train and launch. SIGINT and SIGTERM
    unwind the run (``measure.stop_on_signals``: temporary files, threads,
    child processes and report folders are cleaned up on the way) and end it
    with one line and 128 + the signal; an ``OSError`` (a disk that fills, a
    file-size limit) with one line naming the file, and 1. Bad input is
    ``run_main``'s: one line and 2.
    """
    from ..study import measure  # pylint: disable=import-outside-toplevel  (loads MXNet)
    # Past a file-size limit a write then fails (EFBIG) instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with measure.stop_on_signals():
        try:
            return run_main(argv, make_parser, run_script)
        except measure.Stopped as e:
            print(f'{e}: nothing was written', file=sys.stderr)
            return 128 + e.signum
        except OSError as e:
            where = f' {e.filename}' if e.filename else ''
            print(f'error: could not write{where}: {e.strerror or e}; free space or choose '
                  'another place (nothing was written)', file=sys.stderr)
            return 1


# -- the measuring programs: results kept as measured, resume, memory, Ctrl-C -----------------

#: An environment variable the measuring programs read instead of the system's MemAvailable,
#: in bytes (e.g. ``2e9``): to try, or test, how they answer on a machine with less memory.
MEMORY_VARIABLE = 'GLUON_MULTIGPU_MEMORY_AVAILABLE'


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
    from ..core import devices  # pylint: disable=import-outside-toplevel
    return devices.available_memory()


def add_data_flags(p, what='its images'):
    """Add --data-dir and --download, as every program that reads Fashion-MNIST takes them."""
    p.add_argument('--data-dir', metavar='DIR', type=path_of('a directory'),
                   help=f'Fashion-MNIST folder with the four IDX .gz files; {what} '
                   '(default: ~/.mxnet/datasets/fashion-mnist)')
    p.add_argument('--download', action='store_true',
                   help="download missing files into that folder from MXNet's mirror (needs "
                   'internet)')


def data_root(args, dataset='fashion-mnist'):
    """The data folder of ``args`` (--data-dir, or the data set's default), its files downloaded
    first with --download and checked (``DataError``: one line naming what to do)."""
    import gluon_multigpu as gm  # pylint: disable=import-outside-toplevel
    root = os.path.expanduser(args.data_dir or gm.data.default_root(dataset))
    if args.download:
        gm.data.download_dataset(dataset, root)
    gm.data.check_data_dir(root)
    return root


def add_sweep_flags(p, default):
    """Add --results, --resume and --overwrite: the file every measurement is kept in."""
    p.add_argument('--results', metavar='PATH', type=path_of('a file name'),
                   help='JSON file that keeps every measurement as soon as it is made (replaced '
                   'atomically, marked partial until the run is complete), so that Ctrl-C or a '
                   f'crash loses only the measurement in progress (default: {default})')
    again = p.add_mutually_exclusive_group()
    again.add_argument('--resume', action='store_true',
                   help='continue the run kept in --results: what it measured is not measured '
                   'again (the settings must be the same)')
    again.add_argument('--overwrite', action='store_true',
                   help='replace the results file kept in --results by a new run (it stays as it '
                   'was until the first new measurement is written); without it or --resume, '
                   'an existing results file is refused')


def in_out_folder(results, out):
    """Whether the results file ``results`` is in the folder ``out`` itself (None: no)."""
    return results is not None and out is not None and \
        os.path.realpath(os.path.dirname(os.path.abspath(results))) == os.path.realpath(out)


def results_output(results, out, report_files):
    """What ``files.check_outputs`` checks of --results beside --out: ``[('--results', path)]``.

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
            from ..errors import GluonMultiGPUError  # pylint: disable=import-outside-toplevel
            raise GluonMultiGPUError(f'`results` {results} takes the name of a file of the report '
                                     f'written into --out {out}; give it another name, e.g. '
                                     f'{os.path.join(out, "results.json")}')
        return []
    return [('--results', results)]


class SweepStopped(Exception):
    """A measuring run stopped by a signal; ``sweep`` says what it kept (raised by the programs)."""

    def __init__(self, sweep, signum):
        super().__init__('stopped')
        self.sweep, self.signum = sweep, signum


def _acknowledge(signum):
    name = {signal.SIGINT: 'Ctrl-C', signal.SIGHUP: 'SIGHUP (the terminal closed)'}.get(
        signum, signal.Signals(signum).name)
    say_quietly(f'{name}: stopping after the current step; every measurement finished is kept '
                '(Ctrl-C again to stop now)')


#: The sweep being measured (``measure_sweep``): a second signal lets go of its results file.
_ACTIVE = {'sweep': None}


def _stop_now(signum):  # pylint: disable=unused-argument
    """Before a second signal ends the process (``StopRequest``, from its thread)."""
    sweep = _ACTIVE['sweep']
    if sweep is None:
        say_quietly('stopped at once (a second signal): the measurements finished before are '
                    'kept in the results file')
        return
    whole = sweep.abandon()  # waits for a write of the results file in progress
    if not sweep.done:
        say_quietly('stopped at once (a second signal): nothing had been measured yet, nothing '
                    'was written')
        return
    kept = 'complete' if sweep.complete else 'marked partial'
    say_quietly(f'stopped at once (a second signal): {sweep.describe()} ({kept})'
                + ('' if whole else '; a write of it was still in progress: it holds the '
                   'measurements before the last'))


def measure_sweep(sweep, measure, stop, show_partial):
    """Measure the pending units of ``sweep`` with ``measure(unit)``; return its results.

    ``stop`` is asked before every unit; when it stops the run (``measure.Stopped``,
    or ``Interrupted`` from training), ``show_partial(results)`` prints what was
    measured, and ``SweepStopped`` is raised.
    """
    import gluon_multigpu as gm  # pylint: disable=import-outside-toplevel  (loads MXNet)

    _ACTIVE['sweep'] = sweep
    try:
        with sweep:
            for unit in sweep.pending():
                gm.measure.check_stop(stop)  # before its first line: nothing begins after a stop
                sweep.begin(unit)
                sweep.keep(unit, measure(unit))
            return sweep.results()
    except (gm.measure.Stopped, gm.Interrupted) as e:
        signum = stop.signum or getattr(e, 'signum', None) or signal.SIGINT
        if sweep.done:
            show_partial(sweep.results())
        raise SweepStopped(sweep, signum) from None
    finally:
        sweep.close()  # also when ``with`` was never reached


def partial_heading(sweep):
    """The line above a partial table."""
    return (f'partial results (interrupted): {len(sweep.done)} of {len(sweep.units)} '
            'measurements')


def stopped_line(error, name, argv):
    """The last line of a measuring run stopped by a signal: what it kept, how to go on."""
    sweep = error.sweep
    signame = signal.Signals(error.signum).name
    if sweep is None or not sweep.done:
        return f'interrupted by {signame}: nothing had been measured yet, nothing was written'
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--resume' not in argv:
        argv.append('--resume')
    return (f'interrupted by {signame}: {sweep.describe()} (marked partial); continue with: '
            f'{command_line(name, argv)}')


def sweep_main(argv, make_parser, run_script, name):
    """The ``main`` of a measuring program that keeps its results as it goes; its exit status.

    ``run_script(args, stop)`` measures, asking ``stop`` (a ``StopRequest``)
    between steps, and raises ``SweepStopped`` when it stopped. Ctrl-C,
    SIGTERM or SIGHUP: one line at once, the current step ends, the partial
    table is printed (by ``run_script``), one line says what was kept and how
    to continue, status 128 + the signal; a second signal ends the process at
    once (the results file keeps what was finished). Bad input: one line, 2;
    a write that fails: one line, 1.
    """
    import gluon_multigpu as gm  # pylint: disable=import-outside-toplevel  (loads MXNet)
    args = make_parser().parse_args(argv)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with quiet_console():
        try:
            with gm.StopRequest(_acknowledge, _stop_now) as stop:
                run_began()
                run_script(args, stop=stop)
        except SweepStopped as e:
            say_quietly(stopped_line(e, name, argv))
            return 128 + e.signum
        except gm.GluonMultiGPUError as e:
            say_quietly(error_line(e))
            return 2
        except UsageError as e:
            say_quietly(f'error: {e}')
            return 2
        except OSError as e:
            where = f' {e.filename}' if e.filename else ''
            say_quietly(f'error: could not write{where}: {e.strerror or e}; free space or choose '
                        'another place (the results file keeps what was measured before)')
            return 1
        if stop.signum:  # after the last measurement: the run is complete
            say_quietly(f'{signal.Signals(stop.signum).name} came after the last measurement: '
                        f'the run is complete and written; exit status {128 + stop.signum}')
            return 128 + stop.signum
    return 0


# -- how the program was started, to say how to start it (or another) again ------------------

#: The checkout's scripts/ folder, beside the package (an installed package has none).
CHECKOUT_SCRIPTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'scripts')
_CONSOLE = 'console'
#: The scripts/NAME.py that started the program, _CONSOLE (its console script), or None
#: (not told: called from Python, e.g. a test; the checkout's scripts if there are any).
_STARTED = {'launcher': None}


def started(launcher=None):
    """Record how the program was started: from ``launcher`` (the path of ``scripts/NAME.py``),
    or, without it, as its console script ``gluon-multigpu-NAME``."""
    _STARTED['launcher'] = os.path.abspath(launcher) if launcher else _CONSOLE


def _scripts_folder():
    launcher = _STARTED['launcher']
    if launcher == _CONSOLE:
        return None
    if launcher:
        return os.path.dirname(launcher)
    return CHECKOUT_SCRIPTS if os.path.isdir(CHECKOUT_SCRIPTS) else None


def program(name):
    """How messages name program ``name`` (``train``, ``launch``, ...): as this one was started,
    ``python scripts/NAME.py`` or the console script ``gluon-multigpu-NAME``."""
    return f'python scripts/{name}.py' if _scripts_folder() else f'gluon-multigpu-{name}'


def command_line(name, argv):
    """The command that runs program ``name`` with ``argv`` from the current directory."""
    folder = _scripts_folder()
    if folder is None:
        return shlex.join([f'gluon-multigpu-{name}', *argv])
    script = os.path.abspath(os.path.join(folder, f'{name}.py'))
    relative = os.path.relpath(script)
    return shlex.join(['python', script if relative.startswith('..') else relative, *argv])


def start(main, launcher=None, engine=True, engine_argv=None):
    """Run a program as a command: its engine settings first, then ``main()``; exit with its status.

    ``launcher``: the path of the ``scripts/NAME.py`` that started it (None:
    its console script). ``engine``: set the engine for the device flags of
    ``engine_argv`` (None: the command line's) before MXNet loads; False for
    a program that loads no MXNet.
    """
    started(launcher)
    if engine:
        prepare_engine(engine_argv)
    sys.exit(main())

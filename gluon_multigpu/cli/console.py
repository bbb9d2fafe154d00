"""A program's console and its start: engine settings first, quiet streams, how it was started.

MXNet reads some of its settings once, when its library loads (``OMP_NUM_THREADS``)
or when its engine first needs scratch space (``MXNET_CPU_TEMP_COPY``). So a
program first reads its device flags and calls ``prepare_engine``, which has
``gluon_multigpu.base.engine`` compute and set them, and only then uses
anything of the package that loads MXNet (``start`` does both in that order).
Until the program's own handlers are in place, a stop signal ends it with one
line; once it has stopped a run, the program's ``stop_request`` hands the
signals to nobody (they are ignored while the process ends). The console
streams never raise on a closed terminal (``quiet_console``), and messages
name the programs as this one was started (``program``, ``command_line``).
Nothing in this module loads MXNet.
"""
import contextlib
import os
import shlex
import signal
import sys
import warnings

from . import messages
from .messages import say_quietly  # noqa: F401  (the programs' name for it)
from .arguments import UsageError, engine_devices, error_line
from ..base import compat, engine, signals
from ..errors import GluonMultiGPUError, Interrupted, MXNetLoadError, SettingWarning, flag
from ..filesafety import output
from ..observe.stopping import StopRequest


def apply_engine_settings(num_cpu_devices=None, environ=None, sync_bn=False):
    """``engine.configure`` for a script: a bad engine variable is a ``UsageError``.

    Call before MXNet loads; returns the variables set now.
    """
    try:
        return engine.configure(num_cpu_devices, sync_bn=sync_bn, environ=environ)
    except engine.EngineError as e:
        raise UsageError(e.describe(flag)) from None


#: ``began``: the program's own handlers were installed (a signal after them finds the run
#: ending); ``program``: this process is a program (``start``), which ends once ``main`` returns.
_RUN = {'began': False, 'program': False}


def _stopped_while_starting(signum, frame):  # pylint: disable=unused-argument
    say_quietly(messages.while_starting(signum, _RUN['began']))
    output.discard_unfinished()
    os._exit(128 + signum)  # pylint: disable=protected-access


@contextlib.contextmanager
def stop_request(on_signal, on_second, ignore_after=False):
    """The program's ``StopRequest`` (its handlers in place: ``_RUN['began']``).

    With ``ignore_after``, once it has stopped the run, a program (``start``)
    ignores the stop signals: its status is then 128 + the first signal, as
    its last line says, and a signal that comes while the process ends
    changes neither (one within the window is the same request anyway).
    Called as a function (``main``, the tests), the process's handlers are
    left as they were.
    """
    stop = StopRequest(on_signal, on_second)
    try:
        with stop:
            _RUN['began'] = True  # from its end on, a signal finds the run over, not starting
            yield stop
    finally:
        if ignore_after and stop.signum is not None and _RUN['program']:
            signals.ignore(signals.STOP_SIGNALS)


def prepare_engine(argv=None):
    """The first thing a script does: engine settings for its device flags, before MXNet loads.

    A bad engine variable ends the process with one line and status 2. Until
    the script installs its own handlers, Ctrl-C, SIGTERM or SIGHUP (while
    MXNet loads, which takes seconds) ends it with one line, not a traceback;
    SIGHUP ignored at start (``nohup``) stays ignored.
    """
    signals.install(_stopped_while_starting)  # nohup's SIGHUP stays ignored
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
    turn the next progress line into an exception; a stream Python could not
    open (``2>&-``: ``sys.stderr`` is None) is lost from the start, so that
    its flush at exit does not turn a finished run into status 120. On the first failure the
    stream's descriptor is pointed at the null device, so that what is still
    buffered, and Python's flush at exit, go nowhere quietly.
    """

    def __init__(self, stream):  # None: the descriptor was closed before Python started
        self._stream, self.lost = stream, stream is None

    def _try(self, method, *args):
        """Call the stream's ``method`` unless it is lost; lose it if the call fails."""
        if not self.lost:
            try:
                getattr(self._stream, method)(*args)
            except (OSError, ValueError):
                self.lost = True
                # without a descriptor of its own (a test's capture), dropping the text is enough
                with contextlib.suppress(OSError, ValueError, AttributeError), \
                        open(os.devnull, 'wb') as null:
                    os.dup2(null.fileno(), self._stream.fileno())

    def write(self, text):
        self._try('write', text)
        return len(text)

    def flush(self):
        self._try('flush')

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def quiet_console():
    """Within the block, ``sys.stdout`` and ``sys.stderr`` never raise on a closed terminal."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _QuietStream(sys.stdout), _QuietStream(sys.stderr)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved


# -- how the program was started, to say how to start it (or another) again ------------------

#: The checkout's scripts/ folder, beside the package (an installed package has none).
CHECKOUT_SCRIPTS = os.path.abspath(os.path.join(__file__, '..', '..', '..', 'scripts'))
#: ``folder``: the folder of the scripts/NAME.py that started the program, None for its console
#: script; absent if not told (called from Python, e.g. a test: the checkout's scripts, if any).
_STARTED = {}


def started(launcher=None):
    """Record how the program was started: from ``launcher`` (the path of ``scripts/NAME.py``),
    or, without it, as its console script ``gluon-multigpu-NAME``."""
    _STARTED['folder'] = os.path.dirname(os.path.abspath(launcher)) if launcher else None


def _scripts_folder():
    return _STARTED.get('folder', CHECKOUT_SCRIPTS if os.path.isdir(CHECKOUT_SCRIPTS) else None)


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


def resume_command(name, argv=None):
    """The command that continues a stopped run of program ``name``: ``argv`` (None: this
    process's arguments) with ``--resume``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return command_line(name, argv if '--resume' in argv else [*argv, '--resume'])


def start(main, launcher=None, engine=True, engine_argv=None):  # pylint: disable=W0621
    """Run a program as a command: its engine settings first, then ``main()``; exit with its status.

    ``launcher``, ``engine``, ``engine_argv``: as ``command`` takes them.
    """
    with command(launcher, engine, engine_argv):
        sys.exit(main())


@contextlib.contextmanager
def command(launcher=None, engine=True, engine_argv=None):
    """Within the block, the program's body (train's: its stack then leads one way to the step).

    A NumPy or MXNet (or any other package) whose import fails is one line
    and exit status 2, not a traceback. ``launcher``: the path of the
    ``scripts/NAME.py`` that started it (None: its console script).
    ``engine``: set the engine for the device flags of ``engine_argv`` (None:
    the command line's) before MXNet loads; False for a program that loads
    no MXNet.
    """
    started(launcher)
    _RUN['program'] = True
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        """The package's ``SettingWarning`` as one line on stderr, its arguments as flags."""
        if isinstance(message, SettingWarning):
            say_quietly(f'warning: {message.describe(flag)}')
        else:
            shown(message, category, filename, lineno, file, line)
    warnings.showwarning = show
    if engine:
        prepare_engine(engine_argv)
    try:
        yield
    except Exception as e:  # pylint: disable=broad-except  (re-raised unless an import's)
        # MXNet could not load, wherever the program first needed it; or NumPy or MXNet is
        # missing or broken (the install's). Not an import, or a module of the package's own:
        # a bug, and its traceback.
        loading = isinstance(e, MXNetLoadError)
        if not loading and compat.failing_package(e) in (None, '__main__', __name__.split('.')[0]):
            raise
        say_quietly(f'{os.path.basename(sys.argv[0] or "gluon-multigpu")}: error: '
                    f'{e if loading else compat.load_advice(e)}')
        sys.exit(2)


def stopping_main(argv, make_parser, run_script):
    """The ``main`` of a measuring program: parse ``argv``, call ``run_script(args)``; the status.

    The main of every program but train, launch and the sweeps: 0 when done,
    2 with one line for bad input, 130 on a ``KeyboardInterrupt``. SIGINT,
    SIGTERM and SIGHUP unwind the run (``signals.raising``) and end it with
    one line and 128 + the signal; an ``OSError`` (a disk that fills, a
    file-size limit) with one line naming the file, and 1.
    """
    # Past a file-size limit a write then fails (EFBIG) instead of killing the process.
    signals.ignore((signal.SIGXFSZ,))
    with signals.raising():
        try:
            run_script(make_parser().parse_args(argv))
        except GluonMultiGPUError as e:
            print(error_line(e), file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print('interrupted', file=sys.stderr)
            return 130
        except Interrupted as e:
            e.signum = e.signum or signal.SIGINT  # a request without a signal: as Ctrl-C
            print(messages.nothing_written(e), file=sys.stderr)
            return 128 + e.signum
        except OSError as e:
            print(messages.could_not_write(e, 'nothing was written'), file=sys.stderr)
            return 1
    return 0

"""Ctrl-C in a library run (``interrupt.Interruptible``) and the scripts' wake-up fd (``StopRequest``).

``train`` and ``Training`` add ``Interruptible`` unless a hook handles signals:
the first SIGINT stops after the current step and keeps the run, further ones
never end the process nor raise in the middle of a step, and the handler that
was there before comes back after every ``fit``. ``StopRequest`` (the scripts')
counts only the bytes of its own signals on the wake-up fd, and ends the
process on a second signal only outside a Jupyter kernel. Every stop is an
``Interrupted`` (a ``BaseException``) with its signal, and ``signals.raising``
raises once, where the code is.
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import mxnet as mx
import pytest

import gluon_multigpu as gm
from conftest import REPO, Lines, wait_bounded
import process_state

STEPS = 4  # steps an epoch of the data below


def data():
    """Small synthetic batches: an epoch of ``STEPS`` steps on two devices, in milliseconds."""
    return gm.data.synthetic_data('fashion-mnist', 32, num_train=32 * STEPS, num_test=64,
                                  num_devices=2)


def training(*hooks, say=None):
    """A ``Training`` of the simple CNN on two CPU contexts; ``say``: an Interruptible's lines."""
    train_iter, test_iter = data()
    if say is not None:
        hooks = (*hooks, gm.interrupt.Interruptible(say=say))
    return gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), hooks=hooks)


class PressCtrlC(gm.Hook):
    """Sends this process SIGINT ``times`` times after step ``step`` of epoch ``epoch``."""

    def __init__(self, epoch, step, times=1):
        self.epoch, self.step, self.times = epoch, step, times
        self.handlers = []  # the SIGINT handler seen in each step

    def step_end(self, run, step, samples, timer):
        self.handlers.append(signal.getsignal(signal.SIGINT))
        if (run.epoch, step) == (self.epoch, self.step):
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)


def interruptible(run):
    return next(h for h in run.hooks if isinstance(h, gm.interrupt.Interruptible))


def test_train_adds_interruptible_and_live_unless_a_hook_does_it():
    run = training()
    kinds = [type(h) for h in run.hooks]
    assert gm.interrupt.Interruptible in kinds and gm.live.Live in kinds
    assert gm.StopRequest not in kinds  # its os._exit on a second signal is the scripts' only
    train_iter, test_iter = data()
    own = [gm.StopRequest(), gm.Progress(print)]
    run = gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), hooks=own)
    assert run.hooks == own  # the caller's hooks handle signals and show progress


def test_first_sigint_stops_after_the_step_and_later_ones_only_say_so():
    said = []
    press = PressCtrlC(epoch=1, step=2, times=3)
    run = training(press, say=said.append)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(gm.Interrupted) as stop:
        run.fit(2)
    assert (stop.value.epoch, stop.value.batches, stop.value.epoch_done) == (1, 2, False)
    assert stop.value.training is run and gm.last_run() is run
    hook = interruptible(run)
    assert hook.requests == 3 and hook.signum == signal.SIGINT
    # Said once, and once more for the presses that followed (at most once a second).
    # (the wording of both lines: tests/training/test_messages.py)
    assert len(said) == 2, said
    assert said[0].startswith('interrupted: stopping after the current step')
    assert 'fit() goes on from there' in said[0]
    assert said[1].startswith('interrupted again: still stopping') and 'process' in said[1]
    assert all(h == hook._handle for h in press.handlers)  # ours during the fit
    assert signal.getsignal(signal.SIGINT) is before  # and the previous one after it
    # fit() finishes the interrupted epoch from the same batches, then the next one.
    result = run.fit()
    assert [(e.epoch, e.samples) for e in result.epochs] == [(1, 32 * STEPS), (2, 32 * STEPS)]
    assert run.trainer.optimizer.num_update == 2 * STEPS  # nothing repeated, nothing re-made
    assert hook.requests == 0 and signal.getsignal(signal.SIGINT) is before


def test_sigint_in_the_last_step_of_the_fit_completes_it():
    said = []
    run = training(PressCtrlC(epoch=2, step=STEPS), say=said.append)
    result = run.fit(2)  # the stop falls at the end of the last epoch: nothing left to stop
    assert [e.epoch for e in result.epochs] == [1, 2]
    assert 'after the last step' in said[-1] and said[-1].endswith('the fit is complete')


def test_sigint_in_an_epochs_last_step_stops_at_its_end():
    run = training(PressCtrlC(epoch=1, step=STEPS), say=[].append)
    with pytest.raises(gm.Interrupted) as stop:
        run.fit(3)
    assert stop.value.epoch_done and stop.value.epoch == 1
    assert [e.epoch for e in run.fit().epochs] == [1, 2, 3]


def test_the_previous_handler_comes_back_when_fit_raises():
    class Fails(gm.Hook):
        def step_end(self, run, step, samples, timer):
            raise RuntimeError('a hook failed')
    before = signal.getsignal(signal.SIGINT)
    run = training(Fails(), say=[].append)
    with pytest.raises(RuntimeError, match='a hook failed'):
        run.fit(1)
    assert signal.getsignal(signal.SIGINT) is before


def test_an_ignored_sigint_stays_ignored():
    press = PressCtrlC(epoch=1, step=2)
    run = training(press, say=[].append)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run.fit(1)  # the SIGINT sent is ignored: the fit runs to its end
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert set(press.handlers) == {signal.SIG_IGN}
    assert interruptible(run).requests == 0


def test_a_programs_own_handler_stays():
    """A program that handles SIGINT itself (the scripts unwind and clean up) keeps its way."""
    heard = []

    def own(signum, frame):
        heard.append(signum)
    press = PressCtrlC(epoch=1, step=2)
    run = training(press, say=[].append)
    before = signal.signal(signal.SIGINT, own)
    try:
        result = run.fit(1)  # its handler, not a stop, had the SIGINT
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)
    assert set(press.handlers) == {own} and heard == [signal.SIGINT]
    assert len(result.epochs) == 1 and interruptible(run).requests == 0


def test_outside_the_main_thread_nothing_is_installed():
    handlers, errors = [], []

    class Looks(gm.Hook):
        def step_end(self, run, step, samples, timer):
            handlers.append(signal.getsignal(signal.SIGINT))

    run = training(Looks())

    def fit():
        try:
            mx.npx.set_np()  # MXNet's NumPy mode is per thread
            run.fit(1)
        except Exception as e:  # pylint: disable=broad-except
            errors.append(e)
    thread = threading.Thread(target=fit)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and not errors
    assert set(handlers) == {signal.getsignal(signal.SIGINT)}


def test_a_failing_message_never_raises_into_the_step():
    said = []

    def say(line):
        if not said:  # e.g. a print interrupted inside a print: a reentrant write
            said.append(None)
            raise RuntimeError('reentrant call')
        said.append(line)
    run = training(PressCtrlC(epoch=1, step=2), say=say)
    with pytest.raises(gm.Interrupted):
        run.fit(2)
    assert len(said) == 2 and said[0] is None  # said once it could be
    assert said[1].startswith('interrupted: stopping after the current step')


class Says:
    """An Interruptible's ``say``: each line with the thread that said it."""

    def __init__(self):
        self.lines = []

    def __call__(self, line):
        self.lines.append((threading.current_thread().name, line))


def test_a_thread_acknowledges_at_once_and_other_signals_do_not_count():
    """The watcher says it, not the main thread's handler (which runs only once the step
    returns to Python); SIGWINCH's wake-up bytes are no request."""
    said = Says()
    seen = []

    class Winch(PressCtrlC):
        def step_end(self, run, step, samples, timer):
            if (run.epoch, step) == (1, 1):
                for _ in range(3):
                    os.kill(os.getpid(), signal.SIGWINCH)
            super().step_end(run, step, samples, timer)

    previous = signal.signal(signal.SIGWINCH, lambda signum, frame: seen.append(signum))
    try:
        run = training(Winch(epoch=1, step=2), say=said)
        with pytest.raises(gm.Interrupted) as stop:
            run.fit(1)
    finally:
        signal.signal(signal.SIGWINCH, previous)
    assert stop.value.batches == 2 and len(seen) == 3
    assert len(said.lines) == 1 and said.lines[0][0] == 'interruptible', said.lines
    assert said.lines[0][1].startswith('interrupted: stopping after the current step')
    assert signal.set_wakeup_fd(-1) == -1  # none was there before the fit, none after it


def test_a_wakeup_fd_in_use_stays_and_the_handler_speaks():
    said = Says()
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    before = signal.set_wakeup_fd(writer.fileno())  # an event loop's, say
    try:
        run = training(PressCtrlC(epoch=1, step=2), say=said)
        with pytest.raises(gm.Interrupted):
            run.fit(1)
        assert signal.set_wakeup_fd(writer.fileno()) == writer.fileno()  # still theirs
        assert reader.recv(16) == bytes([signal.SIGINT])  # and its bytes went there
    finally:
        signal.set_wakeup_fd(before)
        reader.close()
        writer.close()
    assert [who for who, _ in said.lines] == ['MainThread']


# StopRequest: the scripts' hook, which listens on the signal wake-up fd.

def wait_until(condition, timeout=30):
    process_state.wait_until(None, 'the condition held', condition, timeout)


@pytest.mark.parametrize('other', [signal.SIGWINCH, signal.SIGCHLD, signal.SIGUSR1])
def test_another_signals_wakeup_byte_does_not_count(other):
    heard = []
    seen = []
    previous = signal.signal(other, lambda signum, frame: seen.append(signum))  # a Python
    try:  # handler: Python writes the signal's byte to the wake-up fd
        with gm.StopRequest(on_signal=heard.append) as stop:
            for _ in range(3):
                os.kill(os.getpid(), other)
            wait_until(lambda: len(seen) == 3 and stop._reader.bytes_read >= 3)  # read them
            assert not stop() and heard == [] and stop._seen == 0
            os.kill(os.getpid(), signal.SIGINT)  # the first of ours: not a second request
            wait_until(lambda: heard)
            assert heard == [signal.SIGINT] and stop._seen == 1 and stop()
    finally:
        signal.signal(other, previous)


def test_in_a_jupyter_kernel_a_second_signal_does_not_end_the_process(monkeypatch):
    monkeypatch.setattr(gm.live, 'jupyter_shell', lambda: object())
    heard, second = [], []
    with gm.StopRequest(on_signal=heard.append, on_second=second.append) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: stop._seen == 1)
        time.sleep(gm.StopRequest.SAME_REQUEST)  # a second request, not the first repeated
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: stop._seen == 2)
    assert heard == [signal.SIGINT] and second == []  # and this process is still here


def test_a_signal_repeated_within_the_window_is_the_same_request():
    """One Ctrl-C delivered twice (the terminal's, and a wrapper's such as ``timeout``)."""
    heard, second = [], []
    with gm.StopRequest(on_signal=heard.append, on_second=second.append,
                        exit_on_second=False) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: heard and stop._reader.bytes_read >= 3)  # read every byte
        assert stop._seen == 1 and stop.signum == signal.SIGINT
        time.sleep(gm.StopRequest.SAME_REQUEST)
        os.kill(os.getpid(), signal.SIGINT)  # past the window: a second request
        wait_until(lambda: stop._seen == 2)
    assert heard == [signal.SIGINT] and second == []  # (exit_on_second=False: nothing ends)


WATCHED = textwrap.dedent('''
    import os, signal, sys, time
    import gluon_multigpu as gm

    def say(line):  # one write: lines from two threads never interleave
        os.write(1, f'{line}\\n'.encode())

    signal.signal(signal.SIGWINCH, lambda signum, frame: None)
    with gm.StopRequest(on_signal=lambda s: say(f'heard {s}')) as stop:
        say('ready')
        deadline = time.monotonic() + 120
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.01)
        say('stopped' if stop() else 'deadline')
        for line in sys.stdin:  # each line asks how many wake-up bytes the watcher has read
            say(f'read {stop._reader.bytes_read}')
    say('done')
''')


def watcher_read(proc, lines):
    """Ask the watched script how many wake-up bytes its watcher has read."""
    asked = len(lines.lines)
    proc.stdin.write('?\n')
    proc.stdin.flush()
    _, line = lines.wait_for(r'^read \d+$', timeout=30, start=asked)
    return int(line.split()[1])


def start_watched():
    proc = subprocess.Popen([sys.executable, '-c', WATCHED], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, Lines(proc.stdout)


@pytest.mark.slow
def test_scripts_stop_request_counts_only_its_own_signals():
    """SIGWINCH bytes before a SIGINT are no first request: the SIGINT stops, never exits."""
    proc, lines = start_watched()
    try:
        lines.wait_for('^ready$')
        for _ in range(3):
            proc.send_signal(signal.SIGWINCH)
        proc.send_signal(signal.SIGINT)
        lines.wait_for(f'^heard {int(signal.SIGINT)}$')
        lines.wait_for('^stopped$')
        before = watcher_read(proc, lines)  # (signals of one kind sent at once may merge)
        proc.send_signal(signal.SIGWINCH)  # after the first: still not a second request
        wait_until(lambda: watcher_read(proc, lines) > before)
        proc.stdin.close()
        status = wait_bounded(proc, 60)
    finally:
        proc.kill()
    assert status == 0 and lines.text()[-1] == 'done'


@pytest.mark.slow
def test_scripts_stop_request_ends_the_process_on_a_second_signal():
    """The command line's behaviour stays: a second Ctrl-C ends the process (128 + SIGINT)."""
    proc, lines = start_watched()
    try:
        lines.wait_for('^ready$')
        proc.send_signal(signal.SIGINT)
        # 'heard', not 'stopped': the window of a repeat begins when the watcher hears the
        # signal, which on a loaded machine can be after the main thread's handler has run
        lines.wait_for(f'^heard {int(signal.SIGINT)}$')
        time.sleep(gm.StopRequest.SAME_REQUEST)  # sooner, it is the first one repeated
        proc.send_signal(signal.SIGINT)
        status = wait_bounded(proc, 60)
    finally:
        proc.kill()
    assert status == 128 + signal.SIGINT and 'done' not in lines.text()


def test_a_second_signal_while_outputs_are_written_leaves_no_temporary_file(tmp_path):
    """A second Ctrl-C ends the process at once (``os._exit``, no ``finally``): the staging
    folder of a report and the temporary file of an output being written go first."""
    out = tmp_path / 'report'
    out.mkdir()
    (out / 'kept.md').write_text('old')
    code = textwrap.dedent(f'''
        import os, signal, sys, time
        from gluon_multigpu.observe import stopping
        from gluon_multigpu.filesafety import output
        with stopping.StopRequest() as stop:
            with output.ReportSet({str(out)!r}) as report:
                with open(report.path('kept.md'), 'w') as f:
                    f.write('new')
                with output.atomic_write({str(tmp_path / 'results.json')!r}) as f:
                    f.write('{{"half": ')
                    print('writing', flush=True)
                    time.sleep(60)
        ''')
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True,
                            cwd=str(REPO))
    try:
        assert proc.stdout.readline() == 'writing\n'
        proc.send_signal(signal.SIGINT)
        time.sleep(gm.stopping.StopRequest.SAME_REQUEST + 0.3)  # a second request, not a repeat
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
    assert sorted(os.listdir(tmp_path)) == ['report']  # no .results.json.*.tmp
    assert os.listdir(out) == ['kept.md'] and (out / 'kept.md').read_text() == 'old'


# The one stop exception, and the stop that raises where the code is.

def test_every_stop_is_an_interrupted_that_except_exception_does_not_catch():
    stops = [gm.Interrupted(1, 2, signum=signal.SIGINT),
             gm.Interrupted.between_runs(2, 'device', ['local'], signal.SIGTERM),
             gm.Interrupted(signum=signal.SIGHUP, message='stopped', sweep=None),
             gm.Interrupted.by_signal(signal.SIGTERM)]
    for stop in stops:
        assert type(stop) is gm.Interrupted and stop.signum is not None  # one class
        with pytest.raises(gm.Interrupted):
            try:
                raise stop
            except Exception:  # pylint: disable=broad-except  (what handles a failure)
                pytest.fail(f'{type(stop).__name__} was caught as a failure')
    assert 'epoch 2 after 5 batch(es)' in str(gm.Interrupted(2, 5))  # wording: test_messages
    assert gm.Interrupted(2, 5).signum is None  # a hook's request: no signal
    assert str(gm.Interrupted.by_signal(signal.SIGTERM)) == 'interrupted by SIGTERM'


def test_a_raising_stop_acts_once_and_hands_the_signals_back():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(gm.Interrupted) as stopped:
        with gm.signals.raising() as stop:
            try:
                signal.raise_signal(signal.SIGTERM)
            finally:
                signal.raise_signal(signal.SIGINT)  # a second signal in the clean-up: ignored
                cleaned.append(True)
    assert cleaned == [True] and stopped.value.signum == stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


class _SignalsWhenCollected:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # the raise happens in __del__: Python swallows it


def test_a_raising_stop_that_python_swallows_is_raised_again_not_lost(capsys):
    # A signal whose Interrupted lands where Python ignores exceptions (a __del__, a function
    # run after fork: seen in the benchmark, which then ran on and exited 0) must still stop.
    unraisable_before = sys.unraisablehook
    with pytest.raises(gm.Interrupted) as stopped:
        with gm.signals.raising():
            _SignalsWhenCollected()  # collected at once: the signal arrives inside __del__
            for _ in range(10 ** 7):  # the next bytecodes outside it raise the stop
                pass
    assert stopped.value.signum == signal.SIGTERM
    assert 'Exception ignored' not in capsys.readouterr().err  # not reported as a failure
    assert sys.unraisablehook is unraisable_before

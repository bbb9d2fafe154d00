"""A run whose steps stop: the stall watch of one process (``stall_timeout``, --stall-timeout),
the steps a launched worker tells its launcher, and how the launcher names the worker behind."""
import faulthandler
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

import gluon_multigpu as gm
from conftest import REPO, Lines, run_bounded, wait_bounded
from process_state import Load
from gluon_multigpu.base import stacks
from gluon_multigpu.observe.stall import (LaunchedStall, StallHook, StepReports, stall_hook,
                                          stall_line)
from gluon_multigpu.multihost import hung
from gluon_multigpu.multihost.plan import Settings, _take_control

TRAIN, HANG = str(REPO / 'scripts' / 'train.py'), str(REPO / 'tests' / 'hang_worker.py')
#: Seconds without a step that the runs below take as a stall.
STALL = 5
#: How much later than the stall time the end may come on a quiet machine: the watch looks once
#: a second, and the process then writes its stacks and ends; the rest is slack. On a loaded
#: machine, scaled by the load measured (``process_state.Load``).
LATE = 15


# -- the argument ---------------------------------------------------------------------------------

@pytest.mark.parametrize('bad', [-1, float('nan'), float('inf'), '10', True, [5]])
def test_a_stall_timeout_that_is_not_a_time_is_refused_in_one_line(bad):
    with pytest.raises(gm.GluonMultiGPUError) as error:
        stall_hook(bad)
    message = str(error.value)
    assert message.startswith(f'`stall_timeout` {bad!r} is not a number of seconds') and \
        '\n' not in message
    train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', 32, num_train=64, num_test=32)
    with pytest.raises(gm.GluonMultiGPUError, match='^`stall_timeout` '):
        gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(1), stall_timeout=bad)


def test_no_stall_timeout_is_no_watch_and_one_is_a_watch_of_this_process():
    assert stall_hook(None) is None and stall_hook(0) is None and stall_hook(0.0) is None
    hook = stall_hook(2.5, environ={})
    assert isinstance(hook, StallHook) and hook.seconds == 2.5 and hook.factor == 0


def test_a_stall_line_names_the_timeout_and_the_steps_seen_and_doubts_a_timeout_near_them():
    # --stall-timeout 0.2 on steps 0.31 s apart: not a hang, and no figure rounded to 0 s
    short = stall_line(0.2, 1.04, 0.31)
    assert short.startswith('no training step was queued for 1 s, past `stall_timeout` 0.2 s '
                            '(the steps before came at most 0.31 s apart): the run is stuck, or '
                            'its steps take longer than that: give a `stall_timeout` several '
                            'times the longest step'), short
    hung = stall_line(60, 61.3, 0.3)
    assert hung.startswith('no training step was queued for 61 s, past `stall_timeout` 60 s '
                           '(the steps before came at most 0.3 s apart): the run is stuck '), hung
    assert '(no time between two steps was measured yet): the run is stuck, or' in \
        stall_line(5, 5.6, 0.0)


def test_unbounded_steps_in_flight_cannot_be_watched():
    # a whole epoch queued at once waits for its steps at its end: no time between steps to watch
    train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', 32, num_train=64, num_test=32)
    with pytest.raises(gm.GluonMultiGPUError, match=r'^`stall_timeout` watches the time between '
                       r'steps, .*give `max_in_flight` 1$'):
        gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(1), num_epochs=1,
                 max_in_flight=0, stall_timeout=60)


def test_a_watched_run_that_does_not_stall_trains_as_without_the_watch():
    train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', 32, num_train=96, num_test=32,
                                                   num_devices=2)
    result = gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2), num_epochs=2,
                      stall_timeout=600)
    assert [e.epoch for e in result.epochs] == [1, 2]
    assert not [t for t in threading.enumerate() if t.name == 'stall-guard']  # ended with the fit


# -- one process: its stacks, one line, status 3 ---------------------------------------------------

#: gm.train of the README with a hook that makes the third step hang inside ``trainer.step``.
LIBRARY_RUN = '''
import sys, time
import gluon_multigpu as gm

class HangInStep(gm.Hook):
    def begin(self, run):
        step, calls = run.trainer.step, [0]
        def hanging_step(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 3:
                print('hangs in step 3', flush=True)
                while True:
                    time.sleep(3600)
            return step(*args, **kwargs)
        run.trainer.step = hanging_step

devices = gm.cpu_devices(2)
train_iter, test_iter = gm.load_data_fashion_mnist(128, root=sys.argv[1], num_train=1280,
                                                   num_test=100)
gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=1,
         stall_timeout=float(sys.argv[2]), hooks=[HangInStep()])
'''


def run_until_it_ends(argv, hang_line, **kw):
    """Run ``argv``; return (seconds from ``hang_line`` on its stdout to its end, status, stdout
    lines, stderr lines, the ``Load`` measured at the end)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        hung_at, _ = out.wait_for(hang_line, timeout=240)
        # (measured while the stall time runs: the deadline is beyond the bound at any load)
        status = wait_bounded(proc, STALL + Load().room(LATE) + 60)
        ended = time.monotonic()
        out.wait_ended(), err.wait_ended()
    finally:
        proc.kill()
    return ended - hung_at, status, out.text(), err.text(), Load()


def assert_ended_late_enough(took, load, line):
    """Not before the stall time, by the watch's own clock (its ``line`` says how long it saw no
    step: this test reads the hang's line later than the run's last step was queued, by as much
    as the machine's load delays the pipe), and not much after it, by this test's clock (the room
    scaled by ``load``)."""
    waited = float(re.search(r'was queued for ([\d.]+) s', line).group(1))
    assert waited >= STALL, f'the watch ended the run after {waited} s without a step: {line}'
    assert took < STALL + load.room(LATE), (
        f'ended {took:.1f} s after the hang, not within {STALL + load.room(LATE):.1f} s; {load}')


def assert_stacks(err, where):
    """``err`` holds faulthandler's dump of every thread, the main one in ``where``."""
    assert any(re.match(r'^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$', l)
               for l in err), err
    assert any(re.search(rf'line \d+ in {where}$', l) for l in err), err
    assert any('observe/stall.py' in l and 'in _stalled' in l for l in err), err  # the watch's thread


@pytest.mark.slow  # a subprocess that waits for its stall
@pytest.mark.xdist_group('timing')  # conftest.TIMING: times the end
def test_a_library_run_that_hangs_in_a_step_writes_its_stacks_and_ends_with_status_3(fashion_dir):
    took, status, out, err, load = run_until_it_ends(
        [sys.executable, '-c', LIBRARY_RUN, str(fashion_dir), str(STALL)], 'hangs in step 3')
    assert status == 3, err
    assert_ended_late_enough(took, load, err[-1])
    assert_stacks(err, 'hanging_step')
    assert re.fullmatch(r'error: no training step was queued for [\d.]+ s, past '
                        rf'`stall_timeout` {STALL} s \(the steps before came at most [\d.]+ s '
                        r"apart\): the run is stuck \(every thread's Python stack is above\); "
                        r'ending the process with status 3: a step stuck inside MXNet cannot be '
                        r'called off', err[-1]), err[-1]


@pytest.mark.slow  # subprocesses
@pytest.mark.xdist_group('timing')  # conftest.TIMING: times the end
def test_train_py_stall_timeout_ends_a_run_stuck_in_a_step_and_keeps_its_checkpoint(
        fashion_dir, tmp_path):
    # 10 steps an epoch: step 13 is the third of epoch 2, after epoch 1's evaluation and checkpoint
    took, status, out, err, load = run_until_it_ends(
        [sys.executable, HANG, '--cpu-devices', '2', '--model', 'simple-cnn', '--num-train',
         '1280', '--num-test', '100', '--num-epochs', '3', '--data-dir', str(fashion_dir),
         '--progress-interval', '0', '--checkpoint-dir', str(tmp_path / 'ckpt'),
         '--stall-timeout', str(STALL)], r'^test hang: rank 0 blocks in step 13$',
        cwd=tmp_path, env=dict(os.environ, GLUON_MULTIGPU_TEST_HANG='13'))
    assert status == 3, err
    assert_ended_late_enough(took, load, err[-1])
    assert [l for l in out if l.startswith('epoch ')][0].startswith('epoch 1/3: ')
    assert_stacks(err, 'stepping')
    assert re.fullmatch(r'error: no training step was queued for [\d.]+ s, past '
                        rf'--stall-timeout {STALL} s \(the steps before came at most [\d.]+ s '
                        r'apart\): '
                        r".*cannot be called off; the last checkpoint is kept, resume with: "
                        r'.* --resume', err[-1]), err[-1]
    assert 'Traceback' not in '\n'.join(err)


@pytest.mark.parametrize('argv, message', [
    (['--stall-timeout', '-1'], '--stall-timeout: -1 is not a finite number of 0 or more; '
     'give a number from 0 to 1e6'),
    (['--stall-timeout', 'soon'], "'soon' is not a number"),
    (['--stall-timeout', '5', '--book-literal'], "--book-literal runs the text's loop, which no "
     'hook follows; drop one of them'),
    (['--stall-timeout', '5', '--max-in-flight', '0'], 'with --max-in-flight 0 a whole epoch is '
     'queued at once and waited for at its end; give --max-in-flight 1 or more'),
])
def test_train_py_refuses_a_stall_timeout_it_cannot_keep_in_one_line(argv, message, tmp_path):
    done = run_bounded([sys.executable, TRAIN, '--cpu-devices', '1', '--model', 'simple-cnn',
                        '--synthetic', *argv], timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert os.listdir(tmp_path) == []


def test_train_py_help_has_the_stall_timeout_with_its_default():
    done = run_bounded([sys.executable, TRAIN, '--help'], timeout=120)
    text = ' '.join(done.stdout.split())
    assert '--stall-timeout SECONDS end a run that queues no step for this long' in text
    assert 'exit status 3 (0: not watched)' in text


# -- a launched worker: what it tells its launcher -----------------------------------------------

def control_pipe():
    """A pipe as an agent hands it to its worker: ``(environ, read end of what it says)``."""
    theirs_r, ours_w = os.pipe()
    ours_r, theirs_w = os.pipe()
    os.set_blocking(ours_r, False)
    environ = {'GLUON_MULTIGPU_CONTROL': f'{theirs_r},{theirs_w}'}
    return environ, ours_r, (theirs_r, ours_w, theirs_w)


def said(fd):
    try:
        return os.read(fd, 65536).decode().split()
    except BlockingIOError:
        return []


def fake_run(hooks, epoch=1, num_epochs=2):
    return types.SimpleNamespace(hooks=hooks, epoch=epoch, num_epochs=num_epochs,
                                 result=types.SimpleNamespace(training=None))


def test_the_stacks_signal_is_caught_again_after_another_handler_replaced_faulthandlers():
    """A handler set with ``signal.signal`` after faulthandler's (a test's, a user's) and put
    back to the default: faulthandler still thinks it holds the signal, and a plain second
    ``register`` would leave it uncaught (the launcher would then not ask for the stacks)."""
    before = signal.getsignal(signal.SIGUSR1)
    try:
        stacks.dump_on_signal()
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert not stacks.catches(os.getpid(), signal.SIGUSR1)
        stacks.dump_on_signal()
        assert stacks.catches(os.getpid(), signal.SIGUSR1)
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, before)


def test_under_the_launcher_the_hook_tells_the_time_reports_steps_and_writes_stacks_on_a_signal():
    environ, ours, fds = control_pipe()
    hook = stall_hook(10, environ=environ)
    assert isinstance(hook, LaunchedStall)
    before = stacks.catches(os.getpid(), signal.SIGUSR1)
    try:
        run = fake_run([hook])
        hook.enter(run)  # alone: it reports the steps itself
        assert stacks.catches(os.getpid(), signal.SIGUSR1)  # faulthandler's, for the launcher
        hook.step_end(run, 1, 32, None)
        hook.step_end(run, 2, 64, None)
        hook.steps_done(run)
        hook.epoch_end(run, None)  # another epoch follows: watched again
        run.epoch = 2
        hook.epoch_end(run, None)  # the last: not
        assert said(ours) == ['stall', '10', 'step', '1', 'step', '2', 'rest', 'watch']
        other = StepReports(fds[2])  # a hook that reports the steps already (distributed.Control)
        run = fake_run([other, hook])
        hook.enter(run)
        hook.step_end(run, 3, 96, None)
        assert said(ours) == ['stall', '10']
    finally:
        if not before:
            faulthandler.unregister(signal.SIGUSR1)
        for fd in (ours, *fds):
            os.close(fd)


# -- the launcher: which worker is behind ---------------------------------------------------------

class FakeRole:
    def __init__(self, index, steps, stepped, rank=None, resting=False, running=True):
        self.kind, self.index, self.host, self.rank = 'worker', index, '10.0.0.9', rank
        self.steps, self.stepped, self.resting, self._running = steps, stepped, resting, running
        self.lost = self.hung = self.status = self.stall = None

    def running(self):
        return self._running

    label = property(lambda self: f'worker {self.index}@{self.host}' +
                     (f' as rank {self.rank}' if self.rank is not None else ''))


def test_the_launcher_names_the_worker_behind_once_no_worker_stepped_for_the_stall_time():
    slow, waiting = FakeRole(0, 2, 100.0, rank=1), FakeRole(1, 3, 101.0, rank=0)
    assert hung.find([slow, waiting], 10, now=110.5) is None  # the last step 9.5 s ago
    stall = hung.find([slow, waiting], 10, now=111.5)
    assert stall.behind == [slow] and stall.others == [waiting]
    assert stall.describe() == (
        'worker 0@10.0.0.9 as rank 1 is stuck in step 3: no worker queued a step for 10 s, and '
        'the other workers wait for it (worker 1@10.0.0.9 as rank 0 after step 3); every '
        "worker's Python stack is in its output; stopping the job")
    waiting.resting = True  # the first worker evaluates: the others wait for it, rightly
    assert hung.find([slow, waiting], 10, now=500.0) is None
    waiting.resting, waiting._running = False, False  # a worker that ended is not watched
    assert hung.find([slow, waiting], 10, now=111.5).others == []
    assert hung.find([slow, waiting], 0, now=999.0) is None  # no stall time: no watch


def test_a_worker_that_never_stepped_is_behind_and_equal_workers_are_all_named():
    late, early = FakeRole(0, 0, None), FakeRole(1, 1, 50.0)
    assert hung.find([late], 10, now=999.0) is None  # nobody stepped yet: still starting
    stall = hung.find([late, early], 10, now=61.0)
    assert stall.behind == [late] and stall.describe().startswith(
        'worker 0@10.0.0.9 is stuck in step 1: no worker queued a step for 10 s')
    a, b = FakeRole(0, 4, 50.0, rank=0), FakeRole(1, 4, 50.5, rank=1)
    assert hung.find([a, b], 10, now=62.0).describe() == (
        'worker 0@10.0.0.9 as rank 0 and worker 1@10.0.0.9 as rank 1 are stuck in step 5: no '
        'worker queued a step for 10 s, and none is behind the others: what they wait for may '
        "be a server, the scheduler or the network; every worker's Python stack is in its "
        'output; stopping the job')
    assert hung.find([a], 10, now=62.0).describe().startswith(
        'worker 0@10.0.0.9 as rank 0 is stuck in step 5: it queued no step for 10 s;')


def test_the_stall_time_is_the_shorter_of_the_launchers_and_the_workers():
    roles = [FakeRole(0, 0, None), FakeRole(1, 0, None)]
    assert hung.stall_seconds(Settings(num_workers=2), roles) == 0
    _take_control(roles[0], ['stall', '30'])
    _take_control(roles[1], ['stall', 'nan'])  # a line that is no time is no time
    assert (roles[0].stall, roles[1].stall) == (30.0, None)
    assert hung.stall_seconds(Settings(num_workers=2), roles) == 30
    assert hung.stall_seconds(Settings(num_workers=2, step_timeout=12.0), roles) == 12
    _take_control(roles[0], ['step', '7'])
    assert roles[0].steps == 7 and roles[0].stepped is not None and not roles[0].resting
    _take_control(roles[0], ['rest'])
    assert roles[0].resting
    _take_control(roles[0], ['watch'])
    assert not roles[0].resting


def test_a_hung_job_restarts_as_a_failed_one_does_and_ends_with_status_3_when_restarts_are_spent():
    from gluon_multigpu.multihost import supervise
    said = []
    job = types.SimpleNamespace(say=said.append, signals=[])
    behind = FakeRole(1, 2, 10.0, rank=1)
    settings = Settings(num_workers=2, max_restarts=1)
    assert supervise._ended(job, settings, hung.STALLED, behind, restarts=0) is None  # again
    assert supervise._ended(job, settings, hung.STALLED, behind, restarts=1) == 3
    assert said == ['gave up after 1 restart(s) (--max-restarts 1)']
    assert supervise._ended(job, Settings(num_workers=2), hung.STALLED, behind, 0) == 3

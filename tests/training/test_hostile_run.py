"""A hostile user's run: signals in every phase, a closed terminal, huge batches, odd environments.

Issue 17, third round: ``--book-literal`` and SIGHUP stop like the fast path;
a signal in an evaluation stops at the epoch's end (or says that the run is
complete); a batch is cut to the data set and bounded by memory; the last
batch of ``--sync-bn`` divides among the devices; engine variables are
checked; empty paths, directories and FIFOs in place of data files, and
abbreviated flags get one line.
"""
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time

import numpy as onp
import pytest

from gluon_multigpu.cli import arguments, console
from gluon_multigpu.cli import messages
import gluon_multigpu as gm
from conftest import REPO, load_script, run_bounded, wait_bounded
from process_state import handles, has_mapped, wait_until

SCRIPT = str(REPO / 'scripts' / 'train.py')
#: The environment of a script run as a user runs it: without the engine settings of this process.
ENV = {k: v for k, v in os.environ.items() if k not in ('MXNET_CPU_TEMP_COPY', 'OMP_NUM_THREADS')}
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


@pytest.fixture(scope='module')
def train_script():
    return load_script('train')


def one_line(err, *phrases):
    """The project's answer to bad input: one line, no traceback, the phrases in it."""
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    for phrase in phrases:
        assert phrase in err, err


def manifest(ckpt):
    return json.loads((ckpt / 'manifest.json').read_text())


class Output:
    """The lines of a process's stdout and stderr, read by threads, waited for with a deadline."""

    def __init__(self, proc):
        self.out, self.err, self._cond = [], [], threading.Condition()
        self._ended = 0
        for stream, lines in ((proc.stdout, self.out), (proc.stderr, self.err)):
            if stream is not None:
                threading.Thread(target=self._read, args=(stream, lines), daemon=True).start()
            else:
                self._ended += 1

    def _read(self, stream, lines):
        for line in stream:
            with self._cond:
                lines.append(line.rstrip('\n'))
                self._cond.notify_all()
        with self._cond:
            self._ended += 1
            self._cond.notify_all()

    def wait_for(self, pattern, timeout=180):
        """Wait until a stdout line matches ``pattern``; fail if the process ends first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(re.search(pattern, line) for line in self.out):
                left = deadline - time.monotonic()
                if self._ended == 2 or left <= 0:
                    raise AssertionError(f'no line {pattern!r}: {self.out} {self.err}')
                self._cond.wait(left)

    def ended(self, timeout=30):
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._ended < 2 and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())


def start(*args, **kwargs):
    proc = subprocess.Popen([sys.executable, SCRIPT, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)
    return proc, Output(proc)


def long_run(fashion_dir, *extra):
    """Many short epochs of the simple CNN: minutes if nothing stops it."""
    return ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '200', '--num-train',
            '2048', '--num-test', '256', '--batch-size', '64', '--data-dir', fashion_dir,
            '--progress-interval', '0', *extra]


# -- 1. --book-literal stops on a signal --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=['SIGINT', 'SIGTERM', 'SIGHUP'])
def test_the_text_loop_stops_on_a_signal(fashion_dir, sig):
    proc, output = start(*long_run(fashion_dir, '--book-literal'))
    try:
        output.wait_for(r'^epoch 2/200: test acc ')
        proc.send_signal(sig)
        status = wait_bounded(proc, 120)
    finally:
        proc.kill()
    output.ended()
    name = signal.Signals(sig).name
    assert status == STATUS[sig], (status, output.err)
    assert 'Traceback' not in '\n'.join(output.err)
    assert re.match(rf'interrupted by {name} (in epoch \d+ after \d+ batch\(es\)|after epoch \d+ '
                    r'had finished its steps, before epoch \d+ began); no checkpoint written',
                    output.err[-1]), output.err
    assert "the text's loop queues them ahead of the devices" in output.err[0]
    assert not any(line.startswith('epoch 200/200') for line in output.out)


def test_train_book_asks_the_stop_request_between_steps(fashion_test):
    images, labels = fashion_test
    data = gm.data.ArrayLoader(images[:256], labels[:256], 32)
    asked = []

    def stop():
        asked.append(len(asked))
        return len(asked) > 3  # asked before each step: three steps, then stop

    with pytest.raises(gm.Interrupted) as stopped:
        gm.train_book(gm.simple_cnn(), data, data, gm.cpu_devices(2), num_epochs=2, lr=0.1,
                      stop=stop)
    assert (stopped.value.epoch, stopped.value.batches, stopped.value.epoch_done) == (1, 3, False)
    # a stop asked for at an epoch's end (its steps all queued): that epoch ends, evaluated
    seen = []
    with pytest.raises(gm.Interrupted) as stopped:
        gm.train_book(gm.simple_cnn(), data, data, gm.cpu_devices(2), num_epochs=3, lr=0.1,
                      on_epoch=seen.append, stop=lambda: bool(seen))
    assert (stopped.value.epoch, stopped.value.batches, stopped.value.epoch_done) == (1, 8, True)
    assert len(seen) == 1 and seen[0].test_acc is not None
    # after the last epoch the run simply ends
    result = gm.train_book(gm.simple_cnn(), data, data, gm.cpu_devices(2), num_epochs=1, lr=0.1,
                           on_epoch=seen.append, stop=lambda: len(seen) > 1)
    assert len(result.epochs) == 1


# -- 2. SIGHUP ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_sighup_stops_after_a_step_and_checkpoints(fashion_dir, tmp_path):
    ckpt = tmp_path / 'ckpt'
    proc, output = start(*long_run(fashion_dir, '--checkpoint-dir', ckpt))
    try:
        output.wait_for(r'^epoch 1/200: ')
        proc.send_signal(signal.SIGHUP)
        status = wait_bounded(proc, 120)
    finally:
        proc.kill()
    output.ended()
    assert status == 129, output.err
    # acknowledged at once, naming the signal and when it stops (wording: test_messages.py)
    assert output.err[0].startswith('SIGHUP (the terminal closed): ') and \
        'after the current step' in output.err[0], output.err
    assert re.match(r'interrupted by SIGHUP (in epoch \d+ after|after epoch \d+ had finished)',
                    output.err[-1]) and f'checkpoint in {ckpt}' in output.err[-1], output.err
    assert manifest(ckpt)['epoch'] >= 1


@pytest.mark.slow
def test_a_closed_terminal_is_no_traceback_and_the_checkpoint_is_written(fashion_dir, tmp_path):
    """Standard output on a terminal that closes (EIO on every write), then SIGHUP."""
    ckpt = tmp_path / 'ckpt'
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, SCRIPT, *long_run(fashion_dir, '--checkpoint-dir',
                                                                 ckpt)],
                            stdout=slave, stderr=subprocess.PIPE, text=True)
    os.close(slave)
    output = Output(proc)
    try:
        seen = b''
        deadline = time.monotonic() + 180
        while b'epoch 1/200' not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert b'epoch 1/200' in seen, (seen, output.err)
        os.close(master)  # the terminal is gone: writes to it fail with EIO from now on
        proc.send_signal(signal.SIGHUP)  # after the close: the order is the program's own
        proc.send_signal(signal.SIGHUP)  # a closing session may repeat it: not "stop now"
        status = wait_bounded(proc, 120)
    finally:
        proc.kill()
    output.ended()
    assert status == 129, output.err
    assert 'Traceback' not in '\n'.join(output.err) and 'could not write' not in output.err[-1]
    assert output.err[-1].startswith('interrupted by SIGHUP'), output.err
    assert manifest(ckpt)['epoch'] >= 1


@pytest.mark.slow
def test_under_nohup_sighup_is_ignored(fashion_dir):
    def ignore_hangups():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    args = long_run(fashion_dir)
    args[args.index('--num-epochs') + 1] = '4'
    proc, output = start(*args, preexec_fn=ignore_hangups)
    try:
        # While MXNet loads: its library is being mapped, the program's own start-up (where a
        # handler would be installed) is behind it.
        wait_until(proc, 'MXNet loads', lambda: has_mapped(proc.pid, 'libmxnet'))
        proc.send_signal(signal.SIGHUP)
        output.wait_for(r'^epoch 1/4: ')
        proc.send_signal(signal.SIGHUP)
        status = wait_bounded(proc, 300)
    finally:
        proc.kill()
    output.ended()
    assert status == 0, output.err
    assert output.out[-1].startswith('test acc: ') and output.err == []


@pytest.mark.slow
def test_sighup_while_mxnet_loads_is_one_line(tmp_path):
    proc = subprocess.Popen([sys.executable, SCRIPT, '--cpu-devices', '2', '--model', 'simple-cnn',
                             '--checkpoint-dir', 'c'], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    # The program's start-up handler is in place; MXNet's import, which takes seconds, follows.
    wait_until(proc, 'the program handles SIGHUP', lambda: handles(proc.pid, signal.SIGHUP))
    proc.send_signal(signal.SIGHUP)
    assert wait_bounded(proc) == 129
    err = proc.stderr.read()
    assert err.count('\n') == 1 and err.startswith('interrupted while starting') and \
        'nothing was written' in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('closed', ['2>&-', '>&-', '>&- 2>&-'])
def test_a_run_started_with_its_output_closed_keeps_its_exit_status(closed, tmp_path):
    """A daemon or a shell's ``2>&-``: Python starts with ``sys.stderr`` (or stdout) None; a
    run that trained is 0, a refused one 2 (it was 120: Python's flush of None at exit)."""
    run = (f'{shlex.quote(sys.executable)} {shlex.quote(SCRIPT)} --cpu-devices 2 --model '
           f'simple-cnn --num-epochs 1 --synthetic --num-train 256 --num-test 64')
    trained = subprocess.run(['bash', '-c', f'{run} --json {tmp_path}/r.json {closed}'],
                             timeout=300, check=False)
    assert trained.returncode == 0 and json.loads((tmp_path / 'r.json').read_text())['complete']
    refused = subprocess.run(['bash', '-c', f'{run} --batch-size 1 {closed}'], timeout=300,
                             check=False)
    assert refused.returncode == 2


def test_a_quiet_console_survives_a_closed_terminal():
    class Gone:
        def write(self, text):
            raise OSError(5, 'Input/output error')

        def flush(self):
            raise OSError(5, 'Input/output error')

        def fileno(self):
            raise ValueError('no descriptor')
    stream = console._QuietStream(Gone())  # pylint: disable=protected-access
    assert stream.write('epoch 1/2: ...\n') == 15 and stream.lost
    stream.flush()
    console.say_quietly('a line', Gone())


# -- 3. a signal in an evaluation ------------------------------------------------------------

def signal_in_evaluation(monkeypatch, sig, epochs):
    """Make ``sig`` arrive during the evaluation of each epoch in ``epochs``."""
    original, words = gm.training.evaluate_accuracy_gpus, messages.train_heard
    calls, heard = [], threading.Event()

    def acknowledged(*args, **kwargs):  # the line the stop request's reader prints, at once
        heard.set()
        return words(*args, **kwargs)
    monkeypatch.setattr(messages, 'train_heard', acknowledged)

    def evaluate(*args, **kwargs):
        calls.append(1)
        if len(calls) in epochs:
            heard.clear()
            os.kill(os.getpid(), sig)
            assert heard.wait(30), 'the signal was not acknowledged'
        return original(*args, **kwargs)
    monkeypatch.setattr(gm.training, 'evaluate_accuracy_gpus', evaluate)


def quick(fashion_dir, *extra):
    return ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-train', '256', '--num-test',
            '64', '--batch-size', '64', '--data-dir', str(fashion_dir), '--progress-interval', '0',
            *map(str, extra)]


def test_a_signal_in_the_last_evaluation_says_the_run_is_complete(train_script, fashion_dir,
                                                                    tmp_path, monkeypatch,
                                                                    capsys):
    signal_in_evaluation(monkeypatch, signal.SIGTERM, {2})
    out = tmp_path / 'runs.json'
    status = train_script.main(quick(fashion_dir, '--num-epochs', 2, '--json', out,
                                     '--checkpoint-dir', tmp_path / 'ckpt'))
    captured = capsys.readouterr()
    assert status == 143
    assert captured.out.splitlines()[-1].startswith('test acc: ')
    last = captured.err.splitlines()[-1]
    assert last.startswith('SIGTERM came after the last step: the run is complete') and \
        'its outputs are written' in last and 'its checkpoint holds it' in last and \
        'exit status 143' in last, last
    assert json.loads(out.read_text())['runs']
    assert manifest(tmp_path / 'ckpt')['epoch'] == 2


def test_a_signal_in_an_earlier_evaluation_stops_at_that_epochs_end(train_script, fashion_dir,
                                                                      tmp_path, monkeypatch,
                                                                      capsys):
    signal_in_evaluation(monkeypatch, signal.SIGINT, {1})
    ckpt = tmp_path / 'ckpt'
    status = train_script.main(quick(fashion_dir, '--num-epochs', 3, '--checkpoint-dir', ckpt))
    captured = capsys.readouterr()
    assert status == 130
    last = captured.err.splitlines()[-1]
    assert last.startswith('interrupted by SIGINT after epoch 1 had finished its steps, before '
                           f'epoch 2 began; checkpoint in {ckpt}; resume with: '), last
    assert 'epoch 2/3' not in captured.out
    state = manifest(ckpt)
    assert state['epoch'] == 1 and state['partial'] is None  # the finished epoch, not a step more


def test_a_worker_stopped_by_the_launcher_is_not_told_to_press_ctrl_c(train_script, fashion_dir,
                                                                       monkeypatch, capsys):
    """The launcher's agent sets the control pipes' variable; its SIGTERM is nobody's Ctrl-C."""
    to_job, from_job = os.pipe(), os.pipe()
    monkeypatch.setenv(gm.agent.CONTROL_VARIABLE, f'{to_job[0]},{from_job[1]}')
    monkeypatch.setattr(gm.distributed, '_CONTROL', None)  # made anew from the variable
    signal_in_evaluation(monkeypatch, signal.SIGTERM, {1})
    try:
        status = train_script.main(quick(fashion_dir, '--num-epochs', 2))
    finally:
        for fd in (*to_job, *from_job):
            os.close(fd)
    err = capsys.readouterr().err.splitlines()
    assert status == 143
    assert err[0].startswith('SIGTERM from the launcher: ') and \
        'after the current step' in err[0], err
    assert 'Ctrl-C' not in '\n'.join(err)
    # outside a launched job the same signal is acknowledged as before
    monkeypatch.delenv(gm.agent.CONTROL_VARIABLE)
    monkeypatch.setattr(gm.distributed, '_CONTROL', None)
    signal_in_evaluation(monkeypatch, signal.SIGTERM, {1})
    assert train_script.main(quick(fashion_dir, '--num-epochs', 2)) == 143
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith('SIGTERM: ') and 'Ctrl-C again to stop now' in first, first


class StopAt(gm.training.Hook):
    """Asks to stop after step ``step`` of ``epoch``."""

    def __init__(self, epoch, step):
        self.epoch, self.step = epoch, step

    def step_end(self, run, step, samples, timer):
        return (run.epoch, step) == (self.epoch, self.step)


def batches(fashion_test, n=4):
    images, labels = fashion_test
    return gm.data.ArrayLoader(images[:64 * n], labels[:64 * n], 64)


def test_a_stop_in_an_epochs_last_step_checkpoints_the_whole_epoch(fashion_test, tmp_path):
    data = batches(fashion_test)
    ckpt = gm.Checkpointer(tmp_path / 'ckpt', {'run': 'last step'})
    with pytest.raises(gm.Interrupted) as stopped:
        gm.train(gm.simple_cnn(), data, data, gm.cpu_devices(2), num_epochs=3, lr=0.1, seed=0,
                 hooks=[ckpt, StopAt(1, 4)])
    assert stopped.value.epoch_done and stopped.value.epoch == 1
    state = manifest(tmp_path / 'ckpt')
    assert state['epoch'] == 1 and state['partial'] is None
    assert state['history'][0]['test_acc'] is not None
    resumed = gm.Checkpointer(tmp_path / 'ckpt', {'run': 'last step'}, resume=True)
    resumed.check_directory(3, len(data))  # a whole epoch: resumable (a "partial" one was not)
    result = gm.train(gm.simple_cnn(), data, data, gm.cpu_devices(2), num_epochs=2, lr=0.1,
                      seed=0, hooks=[resumed])
    assert [r.epoch for r in result.epochs] == [1, 2]


def test_a_hook_can_stop_the_run_at_an_epochs_end(fashion_test):
    class AfterFirst(gm.training.Hook):
        def epoch_end(self, run, record):
            return True
    data = batches(fashion_test, 2)
    with pytest.raises(gm.Interrupted) as stopped:
        gm.train(gm.simple_cnn(), data, data, gm.cpu_devices(2), num_epochs=3, lr=0.1,
                 hooks=[AfterFirst()])
    assert (stopped.value.epoch, stopped.value.batches, stopped.value.epoch_done) == (1, 2, True)
    result = gm.train(gm.simple_cnn(), data, data, gm.cpu_devices(2), num_epochs=1, lr=0.1,
                      hooks=[AfterFirst()])  # nothing left to stop: the run ends as usual
    assert len(result.epochs) == 1


# -- 4. a batch larger than the data set, or than memory ---------------------------------------

def test_a_batch_larger_than_the_data_set_is_cut_to_it(train_script, fashion_dir, capsys):
    argv = quick(fashion_dir, '--num-epochs', 1)
    argv[argv.index('--batch-size') + 1] = '1000000'
    assert train_script.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('--batch-size 1000000 ') and '256 training images' in out[0] and \
        out[0].endswith('using a batch of 256'), out[0]
    assert 'batch 256 (128 per device)' in out[1]


def test_a_batch_beyond_the_memory_available_is_refused_before_loading(train_script, fashion_dir,
                                                                       tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.setattr(gm.devices, 'available_memory', lambda: 3e9)
    fits = gm.model.largest_batch('resnet18', 2, 3e9)
    assert gm.model.memory_needed('resnet18', fits, 2) <= 3e9 < \
        gm.model.memory_needed('resnet18', fits + 1, 2)
    status = train_script.main(['--cpu-devices', '2', '--model', 'resnet18', '--batch-size',
                                '512', '--data-dir', str(fashion_dir), '--json',
                                str(tmp_path / 'r.json')])
    captured = capsys.readouterr()
    need = gm.model.memory_needed('resnet18', 512, 2) / 1e9
    assert status == 2 and captured.out == ''
    one_line(captured.err, f'a batch of 512 on 2 CPU context(s) needs about {need:.1f} GB of '
             'memory for resnet18', '3.0 GB is available', f'use a --batch-size of {fits} or less')
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('flags, says', [
    (['--kvstore', 'nccl'], 'nccl'),
    (['--report', '{tmp}/r.json', '--json', '{tmp}/r.json'], '--report'),
])
def test_what_the_command_line_asks_is_checked_before_the_memory(train_script, fashion_dir, flags,
                                                                 says, tmp_path, monkeypatch,
                                                                 capsys):
    # A mistake in the flags is named whatever the machine has: on a machine short of memory the
    # user learns of it first, not after freeing memory for a run that could never start.
    monkeypatch.setattr(gm.devices, 'available_memory', lambda: 1e9)
    flags = [f.format(tmp=tmp_path) for f in flags]
    status = train_script.main(['--cpu-devices', '2', '--model', 'resnet18', '--batch-size', '512',
                                '--data-dir', str(fashion_dir), *flags])
    err = capsys.readouterr().err
    assert status == 2 and says in err and 'of memory' not in err, err
    assert os.listdir(tmp_path) == []


def test_the_memory_bound_names_a_batch_that_fits_with_sync_bn():
    fits = gm.model.largest_batch('resnet18', 3, 5e9, multiple=3, sync_bn=True)
    assert fits % 3 == 0 and gm.model.memory_needed('resnet18', fits, 3, sync_bn=True) <= 5e9
    with pytest.raises(gm.DeviceError, match=f'use a `batch_size` of {fits} or less'):
        gm.model.check_memory('resnet18', 3000, 3, 5e9, 3, sync_bn=True)
    with pytest.raises(gm.DeviceError, match='too little even for the smallest batch'):
        gm.model.check_memory('resnet18', 2, 2, 1e9)
    gm.model.check_memory('resnet18', 10**6, 2, None)  # unknown: no check


def test_the_memory_available_is_read_from_the_system():
    available = gm.devices.available_memory()
    if not os.path.exists('/proc/meminfo'):
        assert available is None
        return
    total = int(re.search(r'MemTotal:\s+(\d+) kB', open('/proc/meminfo').read()).group(1)) * 1024
    assert 0 < available <= total


@pytest.mark.slow
def test_the_memory_estimate_bounds_a_real_run(fashion_dir):
    """The estimate is an upper bound of the peak resident memory of a short run."""
    code = ('import resource, subprocess, sys\n'
            f'p = subprocess.run([sys.executable, {SCRIPT!r}, "--cpu-devices", "2", "--model", '
            '"simple-cnn", "--batch-size", "2048", "--num-train", "6144", "--num-test", "2048", '
            f'"--num-epochs", "1", "--progress-interval", "0", "--data-dir", {str(fashion_dir)!r}],'
            ' capture_output=True)\n'
            'print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n')
    proc = run_bounded([sys.executable, '-c', code], timeout=300)
    status, peak = map(int, proc.stdout.split())
    assert status == 0
    assert peak <= gm.model.memory_needed('simple-cnn', 2048, 2), peak


# -- 5. --sync-bn: every batch divides among the devices --------------------------------------

def test_with_equal_shards_the_last_batch_divides_among_the_devices():
    images, labels = onp.zeros((64, 28, 28), onp.uint8), onp.arange(64, dtype=onp.int32) % 10
    loader = gm.data.train_loader(images, labels, 33, 3, equal_shards=True)
    sizes = [X.shape[0] for X, _ in loader]
    assert sizes == [33, 30] and loader.num_samples == 63 and len(loader) == 2
    assert [X.shape[0] for X, _ in gm.data.train_loader(images, labels, 33, 3)] == [33, 31]
    loader = gm.data.train_loader(images[:35], labels[:35], 33, 3, equal_shards=True)
    assert [X.shape[0] for X, _ in loader] == [33] and loader.num_samples == 33


@pytest.mark.slow
def test_sync_bn_drops_the_samples_that_make_the_last_batch_uneven(fashion_dir):
    # 10 images in batches of 6 on 3 devices: the last batch, 4, loses 1 and trains as 3 (1 per
    # device), as the last of 64 images in batches of 33 lost 1 and trained as 30; those (and 30
    # test images), ResNet-18's steps being long, made the run twice as long for the same lines
    proc = run_bounded([sys.executable, SCRIPT, '--cpu-devices', '3', '--sync-bn', '--batch-size',
                        '6', '--num-train', '10', '--num-test', '6', '--num-epochs', '1',
                        '--data-dir', str(fashion_dir), '--progress-interval', '0'], timeout=300,
                       env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith('dropping the last 1 training sample(s) of each epoch') and \
        '--sync-bn' in lines[0] and 'the 3 devices' in lines[0], lines[0]
    assert '9 train / 6 test images, batch 6 (2 per device)' in lines[1]


# -- 6. engine variables ----------------------------------------------------------------------

@pytest.mark.parametrize('env, phrase', [
    ({'MXNET_ENGINE_TYPE': 'bogus'}, "MXNET_ENGINE_TYPE='bogus' is none of "
                                     'ThreadedEnginePerDevice, ThreadedEngine, NaiveEngine'),
    ({'MXNET_ENGINE_TYPE': ' NaiveEngine'}, 'MXNET_ENGINE_TYPE'),
    ({'OMP_NUM_THREADS': '\u0662'}, "OMP_NUM_THREADS='\u0662' is not a whole number from 1 to "),
    ({'MXNET_CPU_WORKER_NTHREADS': '\u00a02'}, 'MXNET_CPU_WORKER_NTHREADS'),
    ({'GLUON_MULTIGPU_ENGINE_ENV': 'off'}, "GLUON_MULTIGPU_ENGINE_ENV='off' is none of 0, 1"),
    ({'GLUON_MULTIGPU_OP_CACHE': 'no'}, "GLUON_MULTIGPU_OP_CACHE='no' is none of 0, 1; set 0 "
                                        "to turn the cache of MXNet's operator functions off"),
    ({'MXNET_EXEC_BULK_EXEC_TRAIN': 'abc'}, 'MXNET_EXEC_BULK_EXEC_TRAIN'),
    ({'MXNET_MKLDNN_ENABLED': 'yes'}, "MXNET_MKLDNN_ENABLED='yes' is not a boolean"),
    ({'MXNET_OPTIMIZER_AGGREGATION_SIZE': 'four'}, 'MXNET_OPTIMIZER_AGGREGATION_SIZE'),
    ({'MXNET_UPDATE_ON_KVSTORE': 'abc'}, 'MXNET_UPDATE_ON_KVSTORE'),
])
def test_an_engine_variable_mxnet_cannot_take_is_refused(env, phrase):
    with pytest.raises(gm.engine.EngineError, match=re.escape(phrase)):
        gm.engine.check_environment(env)


def test_engine_variables_mxnet_takes_pass():
    gm.engine.check_environment({'OMP_NUM_THREADS': ' 2 ', 'MXNET_ENGINE_TYPE': 'NaiveEngine',
                           'MXNET_EXEC_BULK_EXEC_TRAIN': 'TRUE', 'MXNET_ENGINE_INFO': '0',
                           'GLUON_MULTIGPU_ENGINE_ENV': '1', 'MXNET_MKLDNN_CACHE_NUM': '-1',
                           'GLUON_MULTIGPU_OP_CACHE': '0'})


@pytest.mark.slow
@pytest.mark.parametrize('env, phrase', [
    ({'MXNET_ENGINE_TYPE': 'bogus'}, 'MXNET_ENGINE_TYPE'),
    ({'OMP_NUM_THREADS': '\u0662'}, 'OMP_NUM_THREADS'),
    ({'MXNET_MKLDNN_ENABLED': 'abc'}, 'MXNET_MKLDNN_ENABLED'),
    ({'MXNET_ENGINE_TYPE': 'NaiveEngine'}, 'unset MXNET_ENGINE_TYPE or drop --sync-bn'),
], ids=['engine type', 'arabic-indic digit', 'boolean', 'naive engine with sync-bn'])
def test_a_bad_engine_environment_is_one_line_before_training(fashion_dir, tmp_path, env, phrase):
    # MXNet would raise (a traceback), abort (134), or (sync-bn on the naive engine) wait forever
    proc = run_bounded([sys.executable, SCRIPT, '--cpu-devices', '2', '--sync-bn', '--batch-size',
                        '4', '--num-train', '8', '--num-test', '4', '--num-epochs', '1',
                        '--data-dir', str(fashion_dir)], timeout=120, cwd=tmp_path,
                       env=dict(ENV, **env))
    assert proc.returncode == 2, proc.stderr
    one_line(proc.stderr, phrase)
    assert proc.stdout == '' and os.listdir(tmp_path) == []


# -- 7. misleading messages -------------------------------------------------------------------

@pytest.fixture
def data_copy(fashion_dir, tmp_path):
    d = tmp_path / 'data'
    d.mkdir()
    for name in gm.data.IDX_FILES.values():
        os.symlink(fashion_dir / name, d / name)
    return d


@pytest.mark.parametrize('kind, phrase', [('directory', 'is a directory, not a data file'),
                                          ('fifo', 'is a FIFO (named pipe), not a data file'),
                                          ('dangling', 'is a symbolic link to nothing')])
def test_a_data_file_that_is_no_file_is_named_as_what_it_is(train_script, data_copy, kind,
                                                            phrase, capsys):
    path = data_copy / 't10k-labels-idx1-ubyte.gz'
    path.unlink()
    {'directory': path.mkdir, 'fifo': lambda: os.mkfifo(path),
     'dangling': lambda: path.symlink_to(data_copy / 'gone')}[kind]()
    assert train_script.main(['--cpu-devices', '2', '--data-dir', str(data_copy)]) == 2
    captured = capsys.readouterr()
    one_line(captured.err, f'{path} {phrase}')
    assert 'lacks' not in captured.err


def test_a_data_folder_that_is_a_file_is_named_so(train_script, tmp_path, capsys):
    (tmp_path / 'file').write_text('not a folder')
    assert train_script.main(['--cpu-devices', '2', '--data-dir', str(tmp_path / 'file')]) == 2
    one_line(capsys.readouterr().err, 'file is a file, not a directory')


def test_reading_a_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / 'pipe')
    with pytest.raises(gm.DataError, match='is a FIFO'):
        gm.read_idx(str(tmp_path / 'pipe'))


@pytest.mark.parametrize('flag', ['--checkpoint-dir', '--data-dir', '--json', '--plot',
                                  '--report'])
@pytest.mark.parametrize('empty', ['', ' '])
def test_an_empty_path_is_refused(train_script, flag, empty, capsys):
    with pytest.raises(SystemExit) as stop:
        train_script.main(['--cpu-devices', '2', flag, empty])
    assert stop.value.code == 2
    one_line(capsys.readouterr().err, f'argument {flag}: ', 'is an empty path; give a')


# -- 8. no abbreviations ----------------------------------------------------------------------

@pytest.mark.parametrize('argv', [['--sync'], ['--cpu', '2'], ['--book'], ['--checkpoint', 'c']])
def test_flags_must_be_written_in_full(train_script, argv, capsys):
    with pytest.raises(SystemExit) as stop:
        train_script.parse_args(argv)
    assert stop.value.code == 2
    one_line(capsys.readouterr().err, 'unrecognized arguments: ' + argv[0])


def test_the_engine_set_up_reads_only_full_flags():
    assert arguments.engine_devices(['--cpu', '3']) != 3
    assert arguments.engine_devices(['--cpu-devices', '3']) == 3
    assert arguments.engine_devices(['--cpu-devices=3']) == 3


def test_sync_bn_on_the_naive_engine_is_refused_before_mxnet_loads():
    with pytest.raises(arguments.UsageError, match='unset MXNET_ENGINE_TYPE or drop --sync-bn'):
        console.apply_engine_settings(2, {'MXNET_ENGINE_TYPE': 'NaiveEngine'}, sync_bn=True)
    assert console.apply_engine_settings(1, {'MXNET_ENGINE_TYPE': 'NaiveEngine'}, sync_bn=True)


@pytest.mark.parametrize('fails', ['json', 'report'])
def test_a_failed_write_of_one_output_leaves_every_output_of_the_earlier_run(
        train_script, fashion_dir, tmp_path, monkeypatch, capsys, fails):
    """--plot, --json and --report are replaced together: a disk that fills while the second
    or the third is written leaves all three as the earlier run wrote them (the new plot beside
    the old JSON before), and the line names only what exists (no checkpoint asked for)."""
    outputs = ['--plot', tmp_path / 'acc.png', '--json', tmp_path / 'runs.json',
               '--report', tmp_path / 'report']
    argv = quick(fashion_dir, '--num-epochs', 1, *outputs)
    assert train_script.main([str(a) for a in argv]) == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()}
    assert {p.name for p in before} >= {'acc.png', 'runs.json', 'report.md'}
    argv += ['--lr', '0.05']  # another run: other figures in every output
    capsys.readouterr()

    def hook(operation, path):
        if operation == 'write' and fails in path:
            raise OSError(28, 'No space left on device', path)
    monkeypatch.setattr(gm.fs, 'hook', hook)
    assert train_script.main([str(a) for a in argv]) == 1
    monkeypatch.setattr(gm.fs, 'hook', None)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith('error: could not write ') and err[-1].endswith(
        '--plot, --json, --report: as before this write)'), err[-1]
    assert 'checkpoint' not in err[-1]
    after = {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()}
    assert after == before


@pytest.mark.parametrize('fails, said', [
    ('runs.json', 'the last complete checkpoint in {ckpt} is kept; resume with: '),
    ('/params', 'no checkpoint was saved in {ckpt}'),
])
def test_a_failed_write_names_the_checkpoint_only_as_it_is(train_script, fashion_dir, tmp_path,
                                                          monkeypatch, capsys, fails, said):
    ckpt = tmp_path / 'ckpt'
    argv = quick(fashion_dir, '--num-epochs', 1, '--json', tmp_path / 'runs.json',
                 '--checkpoint-dir', ckpt)

    def hook(operation, path):
        if operation == 'write' and fails in path:
            raise OSError(28, 'No space left on device', path)
    monkeypatch.setattr(gm.fs, 'hook', hook)
    assert train_script.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.format(ckpt=ckpt) in err and 'if any' not in err, err
    assert ('--json: as before this write' in err) and not (tmp_path / 'runs.json').exists()

"""Steering a run: Ctrl-C acknowledged at once and acting within a step, progress with ETA."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import gluon_multigpu as gm
from conftest import REPO, load_script, wait_bounded, run_bounded

SCRIPT = str(REPO / 'scripts' / 'train.py')
PROGRESS = re.compile(r'  kvstore device on 1 CPU: epoch 1: (\d+)/(\d+) batches, (\d+) images/s, '
                      r'epoch ends in \d+ (s|min|h), run in \d+ (s|min|h)$')


class Lines:
    """The stderr lines of a process, each with the time it arrived, read by a thread."""

    def __init__(self, proc):
        self.lines, self._cond = [], threading.Condition()
        threading.Thread(target=self._read, args=(proc.stderr,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip('\n')))
                self._cond.notify_all()
        with self._cond:
            self.lines.append((time.monotonic(), None))
            self._cond.notify_all()

    def wait_for(self, pattern, timeout=120, start=0):
        """The (time, line) of the first line from ``start`` on that matches ``pattern``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(start, len(self.lines)):
                    when, line = self.lines[i]
                    if line is None:
                        raise AssertionError(f'the process ended before {pattern!r}: '
                                             f'{[l for _, l in self.lines]}')
                    if re.search(pattern, line):
                        return when, line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f'no line {pattern!r} within {timeout} s')
                self._cond.wait(left)


def start(fashion_dir, ckpt, *extra):
    # ResNet-18 on one context with small batches: steps of about a second, as a slow run has
    args = ['--cpu-devices', '1', '--model', 'resnet18', '--batch-size', '16', '--num-train',
            '1600', '--num-test', '50', '--num-epochs', '1', '--data-dir', str(fashion_dir),
            '--checkpoint-dir', str(ckpt), '--progress-interval', '0.2', *extra]
    proc = subprocess.Popen([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, Lines(proc)


@pytest.mark.slow
def test_ctrl_c_is_acknowledged_at_once_and_stops_within_a_step(fashion_dir, tmp_path):
    ckpt = tmp_path / 'ckpt'
    proc, lines = start(fashion_dir, ckpt)
    try:
        lines.wait_for(PROGRESS.pattern)
        _, line = lines.wait_for(PROGRESS.pattern, start=len(lines.lines))
        step_seconds = 16 / int(PROGRESS.match(line).group(3))
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        heard, _ = lines.wait_for('^Ctrl-C: stopping after the current step; Ctrl-C again to '
                                  'stop now$')
        status = wait_bounded(proc, 60)
        ended = time.monotonic()
    finally:
        proc.kill()
    assert status == 130
    assert heard - sent < 1.0, f'acknowledged after {heard - sent:.2f} s'
    # within one step's time and a second (the checkpoint is written in that time too)
    assert ended - sent < step_seconds + 1.5, (ended - sent, step_seconds)
    last = [l for _, l in lines.lines if l][-1]
    assert re.match(r'interrupted by SIGINT in epoch 1 after \d+ batch\(es\); checkpoint in ', last)
    manifest = json.loads((ckpt / 'manifest.json').read_text())
    assert manifest['epoch'] == 0 and manifest['partial']['batches'] >= 2


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(fashion_dir, tmp_path):
    ckpt = tmp_path / 'ckpt'
    proc, lines = start(fashion_dir, ckpt, '--num-epochs', '3', '--num-train', '160')
    try:
        lines.wait_for(r'epoch 2: \d+/10 batches')  # epoch 1 is checkpointed
        proc.send_signal(signal.SIGINT)
        lines.wait_for('^Ctrl-C: stopping after the current step')
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        status = wait_bounded(proc, 60)
        ended = time.monotonic()
    finally:
        proc.kill()
    assert status == 130 and ended - sent < 1.0
    assert lines.wait_for('^stopped at once')
    state = gm.Checkpointer(ckpt, {}).load(check_config=False)  # intact: hashes verified
    assert state.epoch >= 1


def test_help_shows_the_defaults_per_model(capsys):
    with pytest.raises(SystemExit):
        load_script('train').main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert 'resnet18 256 per device, lr 0.1 per 256 samples' in text
    assert 'simple-cnn 64 per device, lr 0.3' in text


@pytest.mark.slow
def test_synthetic_data_needs_no_files(tmp_path):
    proc = run_bounded([sys.executable, SCRIPT, '--cpu-devices', '2', '--model', 'simple-cnn',
                           '--synthetic', '--num-epochs', '1', '--num-train', '256',
                           '--num-test', '64', '--data-dir', str(tmp_path / 'none')],
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'training simple-cnn on fashion-mnist: 256 train / 64 test images' in proc.stdout
    assert re.search(r'^test acc: 0\.\d\d, ', proc.stdout, re.M)
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize('delay', [0.2, 1.0])
def test_ctrl_c_while_mxnet_loads_is_one_line(fashion_dir, tmp_path, delay):
    proc = subprocess.Popen([sys.executable, SCRIPT, '--cpu-devices', '2', '--model', 'simple-cnn',
                             '--data-dir', str(fashion_dir), '--checkpoint-dir', 'c'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    time.sleep(delay)  # the import of MXNet takes about two seconds
    proc.send_signal(signal.SIGINT)
    assert wait_bounded(proc) == 130
    err = proc.stderr.read()
    assert err == 'interrupted while starting: nothing was written\n', err
    assert os.listdir(tmp_path) == []


def test_the_stall_guard_fires_only_while_steps_are_due():
    """A step that never finishes is reported once; an epoch whose steps are done is not watched."""
    import time
    fired = []
    with gm.StallGuard(fired.append, seconds=1.0, factor=1.0) as guard:
        guard.step_end(None, 1, 1, None)
        guard.steps_done(None)  # evaluation follows: not watched
        time.sleep(2.2)
        assert fired == []
        guard.step_end(None, 1, 1, None)  # a step queued, and nothing after it
        time.sleep(2.5)
    assert len(fired) == 1 and fired[0] > 1.0

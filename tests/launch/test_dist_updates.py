"""Accumulated and scheduled updates on MXNet's parameter server: as in one process, resumable."""
import signal
import subprocess
import sys

import numpy as onp
import pytest

from conftest import Lines, run_bounded, wait_bounded
from test_distributed import (LAUNCH, ONE_STEP, TRAIN, launch, saved_params, train_args,
                              worker_hashes)

pytestmark = pytest.mark.slow  # subprocesses: a scheduler, a server and two workers

#: Updates other than the book's: the first update's rate is a quarter of --lr (the warm-up).
UPDATES = ('--lr-schedule', 'cosine', '--warmup-steps', '4')


def test_two_workers_accumulating_equal_one_process_with_the_whole_batch(fashion_dir, tmp_path):
    """Two workers of 2 x 32 samples accumulated make one update of the global batch of 128:
    one process on two contexts with batch 128 (the same samples, the same warm-up rate)."""
    one = run_bounded([sys.executable, TRAIN, '--cpu-devices', '2', '--batch-size', '128',
                       *train_args(fashion_dir, *ONE_STEP, *UPDATES, '--checkpoint-dir',
                                   tmp_path / 'one')], cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    dist = launch(2, TRAIN, '--kvstore', 'dist_sync', '--cpu-devices', '1', '--batch-size', '32',
                  '--accumulate', '2', *train_args(fashion_dir, *ONE_STEP, *UPDATES,
                                                   '--checkpoint-dir', tmp_path / 'dist'),
                  cwd=tmp_path)
    assert dist.returncode == 0, dist.stdout[-2000:]
    a, b = saved_params(tmp_path / 'one'), saved_params(tmp_path / 'dist')
    assert sorted(a) == sorted(b)
    for k in a:  # (a rate of --lr instead of its quarter would be 3 steps' size apart)
        onp.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_stopped_parameter_server_run_resumes_its_schedule_exactly(fashion_dir, tmp_path):
    def command(ckpt, *extra):
        return [sys.executable, LAUNCH, '-n', '2', '-s', '1', '--', sys.executable, TRAIN,
                '--kvstore', 'dist_sync', '--cpu-devices', '1', '--batch-size', '32',
                '--accumulate', '3', '--lr-schedule', 'step', '--warmup-steps', '3',
                *train_args(fashion_dir, '--checkpoint-dir', ckpt, *extra)]
    # (the first worker writes metrics, the other does not: both must update alike)
    whole = run_bounded(command(tmp_path / 'whole', '--metrics', tmp_path / 'm.jsonl'),
                        cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout[-2000:]
    prints = worker_hashes(whole.stdout)
    assert len(prints) == 4 and all(len({p for e, p in prints if e == epoch}) == 1
                                    for epoch in ('1', '2')), prints
    assert '"grad_norm"' not in (tmp_path / 'm.jsonl').read_text()  # no summed gradient here
    parts = tmp_path / 'parts'
    proc = subprocess.Popen(command(parts, '--progress-interval', '0.2'), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        Lines(proc.stdout).wait_for(r'epoch 1/2: loss', timeout=300)
        proc.send_signal(signal.SIGINT)
        assert wait_bounded(proc, 120) == 130
    finally:
        proc.kill()
    resumed = run_bounded(command(parts, '--resume'), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:]
    assert 'resuming from the checkpoint ' in resumed.stdout
    a, b = saved_params(tmp_path / 'whole'), saved_params(parts)
    for k in a:
        onp.testing.assert_array_equal(a[k], b[k], err_msg=k)  # two workers: exact sums

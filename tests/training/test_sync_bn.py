"""Synchronised BatchNorm (--sync-bn): one step on two devices normalises as one device would."""
import json
import os
import sys

import mxnet as mx
import pytest
from mxnet import np

import gluon_multigpu as gm
from conftest import REPO, load_script, run_bounded


@pytest.mark.slow
def test_running_statistics_are_the_same_on_every_device_and_as_one_device_s(fashion_dir):
    """In a process of its own, with the scratch spaces the barrier needs (a hang ends there)."""
    env = {k: v for k, v in os.environ.items() if k not in ('MXNET_CPU_TEMP_COPY', 'OMP_NUM_THREADS')}
    done = run_bounded([sys.executable, str(REPO / 'tests' / 'sync_bn_probe.py'), str(fashion_dir)],
                       timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    sync, plain = result['sync'], result['plain']
    assert sync['num_sync_layers'] == 17 and plain['num_sync_layers'] == 0
    # Synchronised: the 1-device running statistics to float32 round-off, identical devices,
    # the 1-device update within round-off (docs/exercises.md quotes the probe's figures).
    assert sync['stats_vs_one_device'] < 1e-5 * sync['stats_max']
    assert sync['stats_between_devices'] == 0.0
    assert sync['update_vs_one_device'] < 0.1
    # The book's BatchNorm on the same two devices: each device its own statistics.
    assert plain['stats_vs_one_device'] > 1e-3 and plain['stats_between_devices'] > 1e-3
    assert plain['update_vs_one_device'] > 0.5


@pytest.mark.slow
def test_the_cli_trains_with_sync_bn_and_its_checkpoint_remembers(tmp_path):
    ckpt = tmp_path / 'ckpt'
    env = {k: v for k, v in os.environ.items() if k not in ('MXNET_CPU_TEMP_COPY', 'OMP_NUM_THREADS')}
    args = [sys.executable, str(REPO / 'scripts' / 'train.py'), '--cpu-devices', '2',
            '--synthetic', '--num-train', '96', '--num-test', '32', '--batch-size', '32',
            '--num-epochs', '1', '--progress-interval', '0', '--checkpoint-dir', str(ckpt)]
    done = run_bounded(args + ['--sync-bn'], timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    assert 'test acc:' in done.stdout
    manifest = json.loads((ckpt / 'manifest.json').read_text())
    assert manifest['config']['sync_bn'] is True
    # The same folder without --sync-bn is another run.
    again = run_bounded(args + ['--num-epochs', '2', '--resume'], timeout=240, env=env)
    assert again.returncode == 2 and '--sync-bn True (now False)' in again.stderr


def test_sync_bn_refuses_what_it_cannot_synchronise(capsys):
    train = load_script('train')
    for argv, expected in (
            (['--model', 'simple-cnn'], 'has none'),
            (['--split', '1,2'], 'drop --split'),
            (['--split', 'auto'], 'drop --split'),
            (['--book-literal'], 'drop --sync-bn'),
            (['--batch-size', '31'], 'divisible by 2'),
            # this test process runs MXNet with 64 scratch spaces: too few for the barrier
            # (a small batch: the default one's memory, 15 GB, is checked before)
            (['--batch-size', '64'], 'MXNET_CPU_TEMP_COPY=64 can wait forever')):
        assert train.main(['--cpu-devices', '2', '--sync-bn', '--synthetic'] + argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and expected in err, (argv, err)


def test_the_layer_refuses_too_few_scratch_spaces_instead_of_waiting_forever():
    devices = gm.cpu_devices(2)
    net = gm.resnet18(10, norm=gm.sync_bn.sync_batch_norm(2))
    net.initialize(ctx=devices)
    with pytest.raises(gm.DeviceError, match='set MXNET_CPU_TEMP_COPY=256'):
        net(np.zeros((2, 1, 28, 28), ctx=devices[0]))
    assert gm.sync_bn.sync_batch_norm(1) is mx.gluon.nn.BatchNorm
    keys = {b.key for b in (gm.sync_bn.SyncBatchNorm(2), gm.sync_bn.SyncBatchNorm(2))}
    assert len(keys) == 2  # each layer its own barrier


def test_the_scripts_give_synchronised_batchnorm_the_scratch_spaces_it_asks_for():
    """The engine sets them before MXNet loads, so it cannot call sync_bn: the two must agree."""
    for n in (2, 3, 4, 8):
        copies = int(gm.engine.recommended(n, sync_bn=True)['MXNET_CPU_TEMP_COPY'])
        assert copies == gm.sync_bn.cpu_scratch_needed(n)
        gm.sync_bn.check_cpu_scratch(n, copies)  # accepted
        assert gm.engine.recommended(n)['MXNET_CPU_TEMP_COPY'] == '1'  # without it: one a thread
        assert gm.engine.MXNET_COPIES < copies


"""The policy of a run, as the library holds it: what the command line only renders as flags.

Per-model defaults (``recipes``), the batch that fits (``model.fit_batch``),
synchronised BatchNorm's conditions (``sync_bn.check_training``), the
checkpoint of a run (``RunConfig.recorded``, ``checkpoint.for_run``, data
a checkpoint can resume), joining a parameter server (``distributed.join``),
and the run's inputs that no output may replace (``data.input_files``).
Messages name arguments in backquotes; ``describe(errors.flag)`` is the CLI's line.
"""
import os

import mxnet as mx
import numpy as onp
import pytest
from mxnet import gluon, np

import gluon_multigpu as gm
from gluon_multigpu.errors import flag


def cpus(n):
    return [mx.cpu(i) for i in range(n)]


def said(error):
    """What the command line prints for ``error`` (its message with the flags' names)."""
    return error.value.describe(flag)


# --- the batch: the recipe's, cut to the data, checked against memory --------------------------

def test_fit_batch_takes_the_recipe_and_cuts_a_batch_larger_than_the_data(monkeypatch):
    monkeypatch.setattr(gm.devices, 'available_memory', lambda: None)  # unknown: no check
    assert gm.model.fit_batch('simple-cnn', cpus(2), 60000) == (128, None)
    assert gm.model.fit_batch('resnet18', cpus(2), 60000) == (512, None)  # the book's 2 GPUs
    assert gm.model.fit_batch('simple-cnn', cpus(2), 60000, 100) == (100, None)
    batch, note = gm.model.fit_batch('simple-cnn', cpus(2), 101, 1000)
    assert batch == 101 and note.startswith('`batch_size` 1000 ') and '101 training' in note
    assert note.endswith('using a batch of 101')
    assert gm.GluonMultiGPUError(note).describe(flag).startswith('--batch-size 1000 is')
    batch, note = gm.model.fit_batch('resnet18', cpus(2), 101, sync_bn=True)  # equal shards
    assert batch == 100 and note.startswith('the default batch of 512 ') and '101' in note


def test_fit_batch_refuses_a_batch_smaller_than_the_devices_and_one_past_the_memory(monkeypatch):
    with pytest.raises(gm.DeviceError) as error:
        gm.model.fit_batch('simple-cnn', cpus(3), 60000, 2)
    assert 'a batch of 2 ' in said(error) and '3 devices' in said(error)
    assert said(error).endswith('use --batch-size 3 or more')
    monkeypatch.setattr(gm.devices, 'available_memory', lambda: 3e9)
    with pytest.raises(gm.DeviceError) as error:
        gm.model.fit_batch('resnet18', cpus(2), 60000, 512)
    assert 'use a `batch_size` of ' in str(error.value)
    # GPUs hold the batch in their own memory: no estimate of the machine's applies
    assert gm.model.fit_batch('resnet18', [mx.gpu(0), mx.gpu(1)], 60000, 512) == (512, None)


# --- synchronised BatchNorm -----------------------------------------------------------------

@pytest.mark.parametrize('kwargs, flags', [
    (dict(model='simple-cnn'), '--sync-bn synchronises BatchNorm, and --model simple-cnn has '
     'none; use --model resnet18 or drop --sync-bn'),
    (dict(book_literal=True), "--book-literal runs the text's nn.BatchNorm; drop --sync-bn"),
    (dict(split='auto'), "--sync-bn averages the devices' statistics with equal weights, so it "
     'needs equal shards; drop --split'),
    (dict(split=[1, 3]), 'needs equal shards; drop --split'),
    (dict(batch_size=63), '--sync-bn needs equal shards, and a batch of 63 does not divide among '
     '2 devices; use a --batch-size divisible by 2'),
])
def test_sync_bn_refuses_what_it_cannot_synchronise(kwargs, flags):
    args = {'model': 'resnet18', 'devices': cpus(2), 'batch_size': 64, **kwargs}
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.sync_bn.check_training(**args)
    assert flags in said(error)
    assert '--' not in str(error.value)  # the library names arguments, never flags


def test_sync_bn_accepts_an_even_split_and_asks_for_scratch_spaces_on_cpu(monkeypatch):
    monkeypatch.setenv('MXNET_CPU_TEMP_COPY', '256')
    gm.sync_bn.check_training('resnet18', cpus(2), 64)
    gm.sync_bn.check_training('resnet18', cpus(2), 64, split='even')
    monkeypatch.setenv('MXNET_CPU_TEMP_COPY', '64')
    with pytest.raises(gm.DeviceError, match='set MXNET_CPU_TEMP_COPY=256 or more'):
        gm.sync_bn.check_training('resnet18', cpus(2), 64)
    gm.sync_bn.check_training('resnet18', [mx.gpu(0), mx.gpu(1)], 64)  # GPUs: no CPU scratch


# --- the checkpoint of a run ----------------------------------------------------------------

def test_a_run_config_records_what_a_resumed_run_must_match():
    assert gm.RunConfig(model='simple-cnn').recorded(128, 0.3) == {
        'model': 'simple-cnn', 'dataset': 'fashion-mnist', 'batch_size': 128, 'lr': 0.3,
        'seed': 0, 'num_train': 60000, 'num_test': 10000, 'book_literal': False}
    config = gm.RunConfig(model='resnet18', dataset='mnist', seed=3, num_train=640,
                          num_test=100, dtype='float16', sync_bn=True).recorded(64, 0.1, 2)
    assert (config['num_train'], config['num_test'], config['seed']) == (640, 100, 3)
    assert (config['workers'], config['dtype'], config['sync_bn']) == (2, 'float16', True)


def test_for_run_makes_the_checkpoint_a_run_can_follow(tmp_path):
    config = gm.RunConfig(model='simple-cnn').recorded(128, 0.3)
    assert gm.checkpoint.for_run(None, config) is None
    first = gm.checkpoint.for_run(tmp_path / 'c', config, resume=True)
    assert type(first) is gm.Checkpointer and first.resume and first.config == config
    other = gm.checkpoint.for_run(tmp_path / 'c', config, kvstores=['dist_sync'], rank=1)
    assert type(other) is gm.checkpoint.CheckpointReader  # the first worker saves for all
    assert os.listdir(tmp_path) == []  # nothing made before the run takes the directory


@pytest.mark.parametrize('args, flags', [
    (dict(checkpoint_dir=None, resume=True),
     '--resume needs --checkpoint-dir DIR, the directory to resume from'),
    (dict(kvstores=['local', 'device']),
     '--checkpoint-dir follows one run; give a single --kvstore'),
    (dict(book_literal=True), "--book-literal runs the text's loop, which keeps no checkpoints; "
     'drop --checkpoint-dir or --book-literal'),
    (dict(kvstores=['dist_async']), '--kvstore dist_async keeps the optimizer on the servers, '
     'which a checkpoint cannot save; drop --checkpoint-dir or use dist_sync'),
])
def test_for_run_refuses_what_a_checkpoint_cannot_follow(tmp_path, args, flags):
    config = gm.RunConfig(model='simple-cnn',
                          book_literal=args.pop('book_literal', False)).recorded(128, 0.3)
    args.setdefault('checkpoint_dir', tmp_path / 'c')
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.checkpoint.for_run(config=config, **args)
    assert said(error) == flags


def tiny_data(n=64):
    images = onp.random.default_rng(0).integers(0, 255, (n, 28, 28)).astype('uint8')
    labels = onp.random.default_rng(1).integers(0, 10, n).astype('int32')
    return images, labels


def batches_of(images, labels, batch=16):
    return [(np.array(images[i:i + batch, None] / 255.0, dtype='float32'),
             np.array(labels[i:i + batch], dtype='int32')) for i in range(0, len(labels), batch)]


class Steps(gm.Hook):
    """Counts the steps taken."""
    count = 0

    def step_end(self, run, step, samples, timer):
        self.count += 1


@pytest.mark.parametrize('kind', ['list', 'generator', 'DataLoader'])
@pytest.mark.parametrize('resume', [False, True])
def test_a_checkpoint_refuses_data_whose_order_it_cannot_resume_before_any_step(
        tmp_path, kind, resume):
    images, labels = tiny_data()
    data = {'list': lambda: batches_of(images, labels),
            'generator': lambda: (b for b in batches_of(images, labels)),
            'DataLoader': lambda: gluon.data.DataLoader(gluon.data.ArrayDataset(
                images[:, None].astype('float32') / 255, labels), batch_size=16)}[kind]()
    steps, ckpt = Steps(), gm.Checkpointer(tmp_path / 'c', {'k': 1}, resume=resume)
    with ckpt, pytest.raises(gm.CheckpointError) as error:
        gm.train(gm.simple_cnn(), data, None, cpus(2), num_epochs=1, hooks=[ckpt, steps])
    message = str(error.value)
    assert len(message.splitlines()) == 1 and f'this {kind} cannot replay' in message
    assert 'gm.load_data' in message and 'without a Checkpointer' in message
    assert steps.count == 0 and os.listdir(tmp_path) == []


def test_a_checkpoint_resumes_the_packages_loader_and_any_data_that_replays_its_epochs(tmp_path):
    images, labels = tiny_data()
    loader = gm.data.ArrayLoader(images, labels, 16, shuffle=True, seed=1)
    gm.checkpoint.check_resumable(loader)
    gm.checkpoint.check_resumable(gm.distributed.WorkerShard(images, labels, 8, 1, 2))

    class Replays:
        """Its own batches, in an order fixed by ``epoch`` (the package's loaders' protocol)."""
        epoch = 0

        def __iter__(self):
            self.epoch += 1
            return iter(batches_of(images, labels))
    gm.checkpoint.check_resumable(Replays())
    with gm.Checkpointer(tmp_path / 'c', {'k': 1}) as ckpt:
        result = gm.train(gm.simple_cnn(), loader, None, cpus(2), num_epochs=1, hooks=[ckpt])
    assert result.epochs[0].samples == 64 and 'manifest.json' in os.listdir(tmp_path / 'c')


# --- the parameter server -------------------------------------------------------------------

def test_join_is_one_process_without_a_parameter_server():
    worker = gm.distributed.join(['device', 'local'])
    assert worker == gm.distributed.Worker() and (worker.rank, worker.count) == (0, 1)
    assert worker.describe(128) == ''


def test_join_refuses_a_parameter_server_with_other_kvstores_or_outside_the_launcher():
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.distributed.join(['dist_sync', 'device'])
    assert said(error).startswith('--kvstore dist_sync ') and 'give it alone' in said(error)
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.distributed.join(['dist_sync'], environ={'DMLC_ROLE': 'worker'})
    assert ('DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER is not set; '
            'start it with: python scripts/launch.py -n WORKERS') in str(error.value)
    started = dict.fromkeys(gm.distributed.DMLC_VARIABLES, '1')
    with pytest.raises(gm.GluonMultiGPUError) as error:
        gm.distributed.join(['dist_async'], start='my-launcher -- my-program',
                            environ=dict(started, DMLC_ROLE='server'))
    assert said(error).startswith('--kvstore dist_async ') and \
        'DMLC_ROLE=worker is not set' in said(error)
    assert said(error).endswith('start it with: my-launcher -- my-program')


def test_a_worker_trains_on_its_share_of_the_global_batch_and_only_the_first_evaluates():
    class Store:
        type = 'dist_sync'
    assert gm.distributed.Worker(Store(), 1, 2).describe(64) == (
        ' per worker x 2 workers = global batch 128, kvstore dist_sync, worker rank 1')
    images, labels = tiny_data(100)
    train_iter = gm.data.ArrayLoader(images, labels, 16, shuffle=True, seed=3)
    test_iter = gm.data.ArrayLoader(images, labels, 16)
    assert gm.distributed.Worker().shard(train_iter, test_iter) == (train_iter, test_iter)
    shares = [gm.distributed.Worker(Store(), rank, 2).shard(train_iter, test_iter, seed=3)
              for rank in (0, 1)]
    assert shares[0][1] is test_iter and shares[1][1] is None
    assert [len(s) for s, _ in shares] == [3, 3]  # 100 samples: 3 global batches of 32
    whole = gm.data.ArrayLoader(images, labels, 32, shuffle=True, seed=3)  # one process's
    for (_, first), (_, second), (_, both) in zip(shares[0][0], shares[1][0], whole):
        assert onp.array_equal(onp.concatenate([first.asnumpy(), second.asnumpy()]),
                               both.asnumpy())


# --- the run's inputs -----------------------------------------------------------------------

def test_no_output_may_replace_the_runs_data(tmp_path):
    data = tmp_path / 'data'
    data.mkdir()
    inputs = gm.data.input_files('fashion-mnist', str(data))
    assert [os.path.basename(p) for p in inputs] == list(gm.data.IDX_FILES.values())
    assert gm.data.input_files('mnist')[0].startswith(gm.data.default_root('mnist'))
    (data / 'train-images-idx3-ubyte.gz').write_bytes(b'images')
    with pytest.raises(gm.GluonMultiGPUError, match="one of the run's input files"):
        gm.targets.check_outputs(files=[('`json`', str(data / 'train-images-idx3-ubyte.gz'))],
                               inputs=inputs)
    gm.targets.check_outputs(files=[('`json`', str(tmp_path / 'runs.json'))], inputs=inputs)

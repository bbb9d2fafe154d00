"""The fast path computes what the text's loop computes: same model, parameters and update."""
import dataclasses
import os
import sys
import textwrap

import mxnet as mx
import numpy as onp
import pytest
from mxnet import gluon, init, np

import gluon_multigpu as gm
from gluon_multigpu import kvstores, training
from conftest import REPO, run_bounded


def real_batches(fashion_test, n, batch):
    images, labels = fashion_test
    return [(np.array(images[i:i + batch, None] / 255.0, dtype='float32'),
             np.array(labels[i:i + batch], dtype='int32')) for i in range(0, n, batch)]


def params(net, ctx):
    return [p.data(ctx).asnumpy() for p in net.collect_params().values()]


def test_book_resnet18_has_the_same_parameters_in_the_same_order():
    fast, book = gm.resnet18(10), gm.book.resnet18(10)
    for net in (fast, book):
        net.initialize()
        net(np.zeros((1, 1, 28, 28)))
    assert [p.shape for p in fast.collect_params().values()] == \
        [p.shape for p in book.collect_params().values()]
    assert isinstance(book[3][0], gm.Residual) and not isinstance(book[3][0], gluon.HybridBlock)
    assert isinstance(fast[3][0], gm.HybridResidual)


def test_the_fast_resnet18_compiles_as_one_graph(fashion_test):
    # Its containers are HybridSequential, so the whole network is one compiled graph: the
    # blocks' outputs are that graph's kept buffers, not arrays made anew at every step and held
    # for the backward pass (1,402 -> 1,031 MiB at batch 128 on two contexts, docs/results.md)
    net = gm.resnet18(10)
    net.initialize(init.Normal(sigma=0.01), ctx=gm.cpu_devices(2))
    training.hybridize(net)
    X, y = real_batches(fashion_test, 16, 16)[0]
    trainer = kvstores.make_trainer(net, 0.1, 'device')
    gm.train_batch(net, X, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, gm.cpu_devices(2))
    compiled = []
    net.apply(lambda block: compiled.append(block)
              if getattr(block, '_cached_op', None) is not None else None)
    assert compiled == [net]
    # the text's network stays as printed: nn.Sequential containers around nn.Block residuals
    assert all(type(b) is gluon.nn.Sequential for b in gm.book.resnet18(10)[3:7])


def test_hybridized_residual_equals_the_books_block_with_the_same_parameters():
    x = np.random.uniform(size=(4, 8, 6, 6))
    fast, book = gm.HybridResidual(16, True, 2), gm.Residual(16, True, 2)
    for blk in (fast, book):
        blk.initialize(init.Normal(0.1))
        blk(x)
    for p_fast, p_book in zip(fast.collect_params().values(), book.collect_params().values()):
        p_fast.set_data(p_book.data())
    fast.hybridize(static_alloc=True, static_shape=True)
    onp.testing.assert_allclose(fast(x).asnumpy(), book(x).asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('kvstore', ['local', 'device'])
def test_fast_train_equals_the_book_loop_on_the_simple_cnn(fashion_test, kvstore):
    batches = real_batches(fashion_test, 256, 64)
    devices = gm.cpu_devices(2)
    runs = {}
    for name, fn in (('book', gm.train_book), ('fast', gm.train)):
        net = gm.simple_cnn()
        result = fn(net, batches, batches, devices, num_epochs=2, lr=0.2, kvstore=kvstore,
                    seed=3, initializer=init.Uniform(0.07))
        runs[name] = (params(net, devices[1]), result)
    for a, b in zip(runs['book'][0], runs['fast'][0]):
        onp.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for e_book, e_fast in zip(runs['book'][1].epochs, runs['fast'][1].epochs):
        assert e_book.train_loss is None and e_book.train_acc is None  # the text computes neither
        assert e_fast.samples == e_book.samples == 256
        assert e_fast.test_acc == pytest.approx(e_book.test_acc, abs=1 / 256 + 1e-9)


def test_fast_resnet18_step_equals_the_books_within_float_tolerance(fashion_test):
    # BatchNorm's batch statistics are computed per shard in both; the compiled
    # graph sums in another order, so agreement is to float32 rounding.
    X, y = real_batches(fashion_test, 16, 16)[0]
    devices = gm.cpu_devices(2)
    out = {}
    for name, net in (('book', gm.book.resnet18(10)), ('fast', gm.resnet18(10))):
        mx.random.seed(9)
        net.initialize(init.Normal(sigma=0.01), ctx=devices)
        if name == 'fast':
            training.hybridize(net)
        trainer = kvstores.make_trainer(net, 0.1, 'device')
        gm.train_batch(net, X, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
        out[name] = params(net, devices[0])
    for a, b in zip(out['book'], out['fast']):
        onp.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_book_evaluation_equals_ours(fashion_test):
    batches = real_batches(fashion_test, 100, 30)  # last batch of 10: uneven over 3 devices
    net = gm.simple_cnn()
    net.initialize(init.Uniform(0.07), ctx=gm.cpu_devices(3))
    assert gm.evaluate_accuracy_book(net, batches) == \
        gm.evaluate_accuracy_gpus(net, batches, gm.cpu_devices(3))


def test_count_flops_matches_the_layer_arithmetic():
    # multiply-adds of one forward pass, worked out by hand from the layer shapes
    resnet_macs = (28 * 28 * 64 * 9                                   # stem
                   + 4 * 28 * 28 * 64 * 64 * 9                        # stage 1
                   + 14 * 14 * 128 * (64 * 9 + 3 * 128 * 9 + 64)      # stage 2
                   + 7 * 7 * 256 * (128 * 9 + 3 * 256 * 9 + 128)      # stage 3
                   + 4 * 4 * 512 * (256 * 9 + 3 * 512 * 9 + 256)      # stage 4
                   + 512 * 10)                                        # dense
    cnn_macs = 26 * 26 * 20 * 9 + 9 * 9 * 50 * 20 * 25 + 800 * 128 + 128 * 10
    for net, macs in ((gm.book.resnet18(10), resnet_macs), (gm.simple_cnn(), cnn_macs)):
        net.initialize()
        assert gm.count_flops(net, (2, 1, 28, 28)) == 3 * 2 * macs


@pytest.mark.slow
@pytest.mark.parametrize('contexts', [1, 2])
def test_a_script_sets_the_engine_from_its_device_flags_before_mxnet_loads(tmp_path, contexts):
    # scripts/train.py started as a command, its program's main replaced by a probe of what
    # MXNet then loads with: the variables recorded as it loaded, the OpenMP team a CPU
    # operator runs on (the threads a parallel reduction adds, plus its own), NumPy semantics
    probe = tmp_path / 'probe.py'
    probe.write_text(textwrap.dedent(f'''
        import os, runpy, sys
        from gluon_multigpu.cli import train
        imported = 'mxnet' in sys.modules

        def probe_main():
            import gluon_multigpu as gm
            before = 'mxnet' in sys.modules
            gm.simple_cnn()                   # loads MXNet, as the program's run does
            import mxnet as mx
            from mxnet import util
            x = mx.np.ones((1 << 22,), ctx=mx.cpu(0))
            (x[:2] + 1).wait_to_read()
            threads = len(os.listdir('/proc/self/task'))
            x.sum().wait_to_read()
            team = len(os.listdir('/proc/self/task')) - threads + 1
            settings = gm.engine.settings()
            print(imported, before, settings['OMP_NUM_THREADS'], settings['MXNET_CPU_TEMP_COPY'],
                  team, util.is_np_array())
            return 0

        train.main = probe_main
        sys.argv = [{str(REPO / 'scripts' / 'train.py')!r}, '--cpu-devices', '{contexts}']
        runpy.run_path(sys.argv[0], run_name='__main__')
        '''))
    env = {k: v for k, v in os.environ.items()
           if k not in ('MXNET_CPU_TEMP_COPY', 'OMP_NUM_THREADS', 'GLUON_MULTIGPU_ENGINE_ENV')}
    proc = run_bounded([sys.executable, str(probe)], env=env)
    threads = str(max(1, gm.engine.cores() // contexts))
    assert proc.returncode == 0, proc.stderr
    copies = '1'  # scratch copies: one per thread (engine.recommended)
    assert proc.stdout.split() == ['False', 'False', threads, copies, threads, 'True'], \
        proc.stderr


def _compiled_flags(net):
    """The ``static_alloc`` flag each compiled block of ``net`` was hybridized with."""
    blocks = [b for b in [net] + list(net._children.values()) if getattr(b, '_flags', None)]
    return {dict(b._flags).get('static_alloc', False) for b in blocks}


def test_a_recipe_compiles_as_it_says_and_static_alloc_changes_no_number(fashion_test):
    # A recipe may ask for static_alloc (each block's buffers kept between calls): ResNet-18's
    # does, the small CNN's not. The same training either way, to the bit, an epoch's last
    # shorter batch included.
    batches = real_batches(fashion_test, 296, 64)  # 4 batches of 64 and one of 40
    devices = gm.cpu_devices(2)
    runs = {}
    for static in (True, False):
        net = gm.simple_cnn()
        assert net.recipe.static_alloc is False
        net.recipe = dataclasses.replace(net.recipe, static_alloc=static)
        result = gm.train(net, batches, batches, devices, num_epochs=2, lr=0.2, seed=3)
        assert _compiled_flags(net) == {static}
        runs[static] = (params(net, devices[1]), [e.train_loss for e in result.epochs])
    assert runs[True][1] == runs[False][1]
    for a, b in zip(runs[True][0], runs[False][0]):
        assert onp.array_equal(a, b)
    resnet = gm.resnet18(10)
    resnet.initialize(ctx=devices)
    training.hybridize(resnet)
    assert resnet.recipe.static_alloc is True and _compiled_flags(resnet) == {True}


def test_resnet18_with_static_alloc_trains_to_the_bit_as_without(fashion_test):
    # BatchNorm's running statistics included (they are among the parameters compared)
    batches = real_batches(fashion_test, 48, 16)
    devices = gm.cpu_devices(2)
    out = {}
    for static in (True, False):
        mx.random.seed(5)
        net = gm.resnet18(10)
        net.recipe = dataclasses.replace(net.recipe, static_alloc=static)
        net.initialize(init.Normal(sigma=0.01), ctx=devices)
        training.hybridize(net)
        trainer = kvstores.make_trainer(net, 0.1, 'device')
        for X, y in batches:
            gm.train_batch(net, X, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
        out[static] = params(net, devices[1])
    assert len(out[True]) == len(out[False]) > 60
    for a, b in zip(out[True], out[False]):
        assert onp.array_equal(a, b)

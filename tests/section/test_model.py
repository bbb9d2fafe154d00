import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, init, np
from mxnet.gluon import nn

import gluon_multigpu as gm


def book_resnet18_shapes(num_classes, in_channels=1):
    """The parameter shapes of the book's ResNet-18, in registration order, built by hand."""
    def conv(c_out, c_in, k):
        return [(c_out, c_in, k, k), (c_out,)]

    def bn(c):
        return [(c,)] * 4  # gamma, beta, running_mean, running_var

    def residual(c_in, c, use_1x1conv):
        shapes = conv(c, c_in, 3) + conv(c, c, 3)
        if use_1x1conv:
            shapes += conv(c, c_in, 1)
        return shapes + bn(c) + bn(c)

    shapes = conv(64, in_channels, 3) + bn(64)
    c_in = 64
    for c, first in ((64, True), (128, False), (256, False), (512, False)):
        shapes += residual(c_in, c, not first) + residual(c, c, False)
        c_in = c
    return shapes + [(num_classes, 512), (num_classes,)]


def initialised(net, shape=(2, 1, 28, 28), ctx=None):
    net.initialize(init.Normal(sigma=0.01), ctx=ctx)
    out = net(np.random.uniform(size=shape, ctx=ctx or mx.cpu()))
    return out


def test_resnet18_has_the_books_layers_shapes_and_order():
    net = gm.book.resnet18(10)
    out = initialised(net)
    assert out.shape == (2, 10)
    shapes = [p.shape for p in net.collect_params().values()]
    assert shapes == book_resnet18_shapes(10)
    trainable = sum(int(onp.prod(p.shape)) for p in net.collect_params().values()
                    if p.grad_req != 'null')
    # From ImageNet ResNet-18's published 11,689,512: minus its 7x7x3 stem (9,408), its
    # 1000-way fc (513,000) and its downsample BatchNorms (1,792); plus this stem with
    # bias (640), a 10-way Dense (5,130) and the biases of the 19 block convolutions (4,736).
    assert trainable == 11_689_512 - 9_408 - 513_000 - 1_792 + 640 + 5_130 + 4_736


def test_resnet18_structure_stem_without_max_pool():
    net = gm.book.resnet18(10)
    kinds = [type(b).__name__ for b in net]
    assert kinds == ['Conv2D', 'BatchNorm', 'Activation', 'Sequential', 'Sequential',
                     'Sequential', 'Sequential', 'GlobalAvgPool2D', 'Dense']
    stem = net[0]
    assert stem._kwargs['kernel'] == (3, 3) and stem._kwargs['stride'] == (1, 1)
    assert stem._kwargs['pad'] == (1, 1)


def test_residual_halves_spatial_size_with_stride_two():
    blk = gm.Residual(8, use_1x1conv=True, strides=2)
    out = initialised(blk, shape=(1, 4, 6, 6))
    assert out.shape == (1, 8, 3, 3)
    same = gm.Residual(4)
    assert initialised(same, shape=(1, 4, 6, 6)).shape == (1, 4, 6, 6)


def test_hybridize_compiles_the_hybrid_residual_whole_and_only_the_layers_of_the_books():
    """``Residual`` is an ``nn.Block``: ``hybridize`` compiles its layers one by one and its
    ``forward`` stays Python; ``HybridResidual`` becomes one graph. With the same parameters
    all three compute the same (in training mode: BatchNorm on the batch's statistics)."""
    x = np.random.uniform(size=(2, 3, 8, 8))
    book = gm.Residual(4, use_1x1conv=True, strides=2)
    book.initialize(init.Normal(sigma=0.1))
    with autograd.record():
        eager = book(x).asnumpy()
    book.hybridize()
    with autograd.record():
        layers = book(x).asnumpy()
    assert not isinstance(book, nn.HybridBlock)
    assert all(layer._cached_op is not None for layer in book._children.values())
    whole = gm.HybridResidual(4, use_1x1conv=True, strides=2)
    whole.initialize()
    whole(x)
    for mine, books in zip(whole.collect_params().values(), book.collect_params().values()):
        mine.set_data(books.data())
    whole.hybridize()
    with autograd.record():
        compiled = whole(x).asnumpy()
    assert whole._cached_op is not None  # one graph, holding every layer:
    assert all(layer._cached_op is None for layer in whole._children.values())
    assert whole._cached_graph[1].tojson().count('"op": "Convolution"') == 3
    onp.testing.assert_allclose(layers, eager, rtol=1e-5, atol=1e-6)
    onp.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)


def test_simple_cnn_matches_the_lab():
    net = gm.simple_cnn()
    out = initialised(net)
    assert out.shape == (2, 10)
    shapes = [p.shape for p in net.collect_params().values()]
    assert shapes == [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (128, 50 * 4 * 4), (128,),
                      (10, 128), (10,)]


def test_get_model_by_cli_name_and_unknown_name():
    assert isinstance(gm.get_model('simple-cnn'), mx.gluon.nn.Sequential)
    with pytest.raises(ValueError, match='unknown model'):
        gm.get_model('vgg')

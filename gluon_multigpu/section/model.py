"""The networks: the book's modified ResNet-18 and the Gluon multi-GPU lab's small CNN."""
import math

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
from mxnet import autograd, np, npx
from mxnet.gluon import nn

from . import devices as _devices
from ..base.values import known
from ..errors import DeviceError, GluonMultiGPUError
from .recipes import RECIPES

__all__ = ['Residual', 'HybridResidual', 'resnet18', 'text_resnet18', 'simple_cnn', 'get_model',
           'default_initializer', 'count_flops', 'MODELS', 'MEMORY', 'SYNC_BN_MEMORY',
           'memory_needed', 'largest_batch', 'check_memory', 'fit_batch', 'check_batch_memory']


class _ResidualLayers:  # pylint: disable=too-few-public-methods
    """A residual block's layers, the book's, in the book's order (so parameters match), for
    ``Residual`` and ``HybridResidual`` (before their ``nn.Block`` or ``nn.HybridBlock``).

    ``norm`` makes each batch-normalisation layer (``nn.BatchNorm`` in the book).
    """

    def __init__(self, num_channels, use_1x1conv=False, strides=1, norm=nn.BatchNorm, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = nn.Conv2D(num_channels, kernel_size=3, padding=1, strides=strides)
        self.conv2 = nn.Conv2D(num_channels, kernel_size=3, padding=1)
        self.conv3 = (nn.Conv2D(num_channels, kernel_size=1, strides=strides) if use_1x1conv
                      else None)
        self.bn1, self.bn2 = norm(), norm()


class Residual(_ResidualLayers, nn.Block):
    """The residual block of ResNet as the text writes it (d2l 8.6): an ``nn.Block``, run eagerly.

    Two 3x3 convolutions of ``num_channels`` with batch norm (``norm`` makes
    each layer; ``nn.BatchNorm``, the book's), the first with ``strides``, and
    the input added back, through a 1x1 convolution if ``use_1x1conv``.
    """

    def forward(self, X):  # pylint: disable=arguments-differ
        Y = npx.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return npx.relu(Y + X)


class HybridResidual(_ResidualLayers, nn.HybridBlock):
    """``Residual`` as a ``HybridBlock``, so that ``hybridize`` can compile it (the fast path).

    Same layers, parameters, order and arithmetic; parameters as ``Residual``.
    Two operators differ, not what they compute (docs/results.md, "Where a
    ResNet-18 step's time goes"): the ReLU is MXNet's ``Activation``, which
    runs oneDNN's kernel, where ``npx.relu`` runs a plain loop; and the
    residual sum is the element-wise ``elemwise_add`` of equal shapes, whose
    backward pass hands the gradient on, where ``Y + X`` is a broadcasting
    sum whose backward pass reduces over (absent) broadcast axes through
    scratch space. Together 1.15 times the images/s on two CPU contexts, and
    about 0.4 GB less resident memory.
    """

    def hybrid_forward(self, F, X):  # pylint: disable=arguments-differ
        Y = F.npx.activation(self.bn1(self.conv1(X)), act_type='relu')
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        # elemwise_add is a legacy operator: it takes and gives NDArrays (the same memory)
        added = F.elemwise_add(Y.as_nd_ndarray(), X.as_nd_ndarray()).as_np_ndarray()
        return F.npx.activation(added, act_type='relu')


def _resnet_block(residual, num_channels, num_residuals, norm, first_block=False):
    """Return one ResNet stage; all but the first halve height and width."""
    blk = _container(residual)()
    for i in range(num_residuals):
        halve = i == 0 and not first_block
        blk.add(residual(num_channels, use_1x1conv=halve, strides=2 if halve else 1, norm=norm))
    return blk


def _container(residual):
    """The text's ``nn.Sequential`` around its ``Residual``; around ``HybridResidual`` a
    ``HybridSequential``, so that the whole network compiles as one graph."""
    return nn.HybridSequential if issubclass(residual, nn.HybridBlock) else nn.Sequential


def _resnet18(num_classes, residual, norm):
    npx.set_np()  # the layers take the semantics of the thread that builds them: turn them on
    net = _container(residual)()
    # This model uses a smaller convolution kernel, stride, and padding and
    # removes the max-pooling layer
    net.add(nn.Conv2D(64, kernel_size=3, strides=1, padding=1), norm(), nn.Activation('relu'))
    net.add(_resnet_block(residual, 64, 2, norm, first_block=True),
            *(_resnet_block(residual, channels, 2, norm) for channels in (128, 256, 512)))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(num_classes))
    return net


def text_resnet18(num_classes=10, norm=nn.BatchNorm):
    """Return the book's slightly modified ResNet-18 (d2l 13.6), built from ``Residual`` as printed.

    Compared with the ImageNet ResNet-18 it uses a 3x3 stem with stride 1 and
    padding 1 and no max-pooling, because the input images are small.

    Parameters
    ----------
    num_classes : int
        Outputs of the final Dense layer.
    norm : callable
        Makes each batch-normalisation layer: ``nn.BatchNorm`` (the book's), or a
        synchronised one (``sync_bn.sync_batch_norm``).
    """
    return _resnet18(num_classes, Residual, norm)


def resnet18(num_classes=10, norm=nn.BatchNorm):
    """Return the book's ResNet-18 built from ``HybridResidual``: the fast path's network.

    The same layers and parameters, in the same order, as the text's
    ``text_resnet18`` (``book.resnet18``), but compilable, in
    ``HybridSequential`` containers: ``train`` hybridizes it as one graph
    (0.74x the memory of compiling each block apart, docs/results.md,
    "Memory"). It carries its recipe (``recipes.RECIPES['resnet18']``).
    """
    net = _resnet18(num_classes, HybridResidual, norm)
    net.recipe = RECIPES['resnet18']
    return net


def simple_cnn(num_classes=10):
    """Return the Gluon multi-GPU lab's small CNN, a model that trains in seconds.

    conv 20 3x3 relu, max-pool 2, conv 50 5x5 relu, max-pool 2, flatten,
    dense 128 relu, dense ``num_classes``. It has no BatchNorm, so a step on
    several devices equals a step on one device with the whole batch.
    """
    npx.set_np()  # the layers take the semantics of the thread that builds them: turn them on
    net = nn.Sequential()
    net.add(nn.Conv2D(channels=20, kernel_size=3, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=50, kernel_size=5, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(), nn.Dense(128, activation='relu'), nn.Dense(num_classes))
    net.recipe = RECIPES['simple-cnn']
    return net


#: The networks by name; every one is hybridizable (the fast path compiles it).
MODELS = {'resnet18': resnet18, 'simple-cnn': simple_cnn}
#: The networks with batch normalisation (``get_model`` takes their ``norm``).
NORMALISED = ('resnet18',)


def count_flops(net, input_shape=(1, 1, 28, 28)):
    """Return the training FLOPs per sample of ``net``, counted from its layer shapes.

    Counts the multiply-adds of every ``Conv2D`` and ``Dense`` layer in one
    forward pass (2 FLOPs each) and takes a training step as 3 forward passes
    (the backward pass computes a gradient for the inputs and one for the
    weights, each as costly as the forward). BatchNorm, activations and
    pooling are left out: they move memory rather than multiply.

    Parameters
    ----------
    net : Block
        An initialised, not hybridized network (hooks do not fire in a compiled graph).
    input_shape : tuple
        Shape of one input batch; the count is divided by its first dimension.

    Returns
    -------
    float
        FLOPs of one training step per sample.
    """
    macs = []

    def hook(block, inputs, output):
        x = inputs[0]
        if isinstance(block, nn.Conv2D):
            kwargs = block._kwargs  # pylint: disable=protected-access
            macs.append(output.size * (x.shape[1] // kwargs.get('num_group', 1))
                        * math.prod(kwargs['kernel']))
        else:
            macs.append(output.size * (x.size // x.shape[0]))

    blocks = []
    net.apply(blocks.append)  # every block of ``net``, itself included
    handles = [block.register_forward_hook(hook) for block in blocks
               if isinstance(block, (nn.Conv2D, nn.Dense))]
    with autograd.predict_mode():  # on the device of the first parameter
        net(np.zeros(input_shape, ctx=list(net.collect_params().values())[0].list_ctx()[0]))
    for h in handles:
        h.detach()
    return 3 * 2 * sum(macs) / input_shape[0]


def get_model(name, num_classes=10, norm=None):
    """Return a new, uninitialised network by its CLI name (``resnet18``, ``simple-cnn``).

    ``norm`` makes the batch-normalisation layers of a network that has them
    (ResNet-18; the simple CNN has none); None: ``nn.BatchNorm``.
    """
    known(name, MODELS, 'model', ValueError)
    if norm is None:
        return MODELS[name](num_classes)
    if name not in NORMALISED:
        raise GluonMultiGPUError(f'model {name} has no batch normalisation to synchronise; '
                                 f'choose {", ".join(NORMALISED)}')
    return MODELS[name](num_classes, norm=norm)


def default_initializer(name):
    """Return the initializer the source text uses for a model.

    ResNet-18: the book's ``Normal(sigma=0.01)`` (BatchNorm rescales it).
    Simple CNN: MXNet's default ``Uniform(0.07)``, as in the lab;
    without BatchNorm, ``Normal(0.01)`` leaves it stuck near chance for epochs.
    """
    known(name, MODELS, 'model', ValueError)
    return RECIPES[name].initializer()


#: Peak memory (resident set) of a training run on CPU contexts, per model: (bytes for the
#: process, bytes per device, bytes per sample of the batch). An upper bound fitted to the peak
#: RSS of runs of three steps on Fashion-MNIST (MXNet 1.9.1, 2-core CPU; docs/guide.md), each
#: context's passes queued from its own thread with MXNet's 4 scratch copies (``pushers``;
#: with one copy and ResNet-18's static_alloc since, 1.53 GB at batch 128 on 2 contexts, 1.09 GB
#: compiled as one graph):
#: ResNet-18 0.54 GB at batch 16 on 1 context, 0.92 on 2, then 4.0-4.5 MB more per sample
#: (2 contexts: 1.37 GB at batch 128, 1.88 at 256, 3.16 at 512; 1.49 GB at batch 96 on 3
#: contexts, 1.89 at 128 on 4; the book's run, batch 512, 2.9 GB in its fourth epoch), with
#: a third more per sample for what a longer run adds; the simple CNN 0.35 GB at batch 256,
#: then 0.28-0.38 MB per sample (batch 8192: 3.3 GB, 32768: 10.0 GB; a user saw 17.3 GB at
#: 60000).
MEMORY = {'resnet18': (300e6, 400e6, 6e6), 'simple-cnn': (850e6, 10e6, 320e3)}
#: The same with synchronised BatchNorm (``sync_bn``): ResNet-18 on 2 contexts 2.9 GB at
#: batch 64 and 7.8 GB at 256, 25 MB more per sample.
SYNC_BN_MEMORY = {'resnet18': (600e6, 300e6, 27e6)}


def _memory(name, sync_bn):
    return (SYNC_BN_MEMORY if sync_bn else MEMORY).get(name)


def memory_needed(name, batch_size, num_devices, sync_bn=False):
    """Estimated peak memory in bytes of training model ``name`` on CPU contexts (``MEMORY``)."""
    fixed, per_device, per_sample = _memory(name, sync_bn)
    return int(fixed + per_device * num_devices + per_sample * batch_size)


def largest_batch(name, num_devices, available, multiple=1, sync_bn=False):
    """The largest batch (a multiple of ``multiple``) whose estimate fits in ``available`` bytes.

    0 when not even ``multiple`` samples fit.
    """
    fixed, per_device, per_sample = _memory(name, sync_bn)
    most = int((available - fixed - per_device * num_devices) // per_sample)
    return max(0, most - most % multiple)


def _size(num_bytes):
    return f'{num_bytes / 1e9:.1f} GB' if num_bytes >= 1e9 else f'{num_bytes / 1e6:.2g} MB'


def check_memory(name, batch_size, num_devices, available, multiple=1, sync_bn=False):
    """Raise ``DeviceError`` when a batch of ``batch_size`` would need more than ``available``.

    For CPU contexts, where a batch's activations live in the machine's
    memory: past it, the system swaps or kills the process. The message says
    the largest batch that fits (a multiple of ``multiple``, e.g. the devices
    for equal shards). ``available`` None (unknown) or a model without an
    estimate: no check.
    """
    if available is None or (figures := _memory(name, sync_bn)) is None or \
            (need := memory_needed(name, batch_size, num_devices, sync_bn)) <= available:
        return
    fits = largest_batch(name, num_devices, available, multiple, sync_bn)
    what = (f'a batch of {batch_size} on {num_devices} CPU context(s) needs about {_size(need)} '
            f'of memory for {name}{" with `sync_bn`" if sync_bn else ""} (about '
            f'{_size(figures[2])} per sample), and {_size(available)} is available')
    if fits >= max(num_devices, multiple):
        raise DeviceError(f'{what}; use a `batch_size` of {fits} or less')
    raise DeviceError(f'{what}, too little even for the smallest batch; free memory or use a '
                      'machine with more')


def fit_batch(name, devices, num_train, batch_size=None, sync_bn=False, memory=True):
    """Return ``(batch_size, note)``: the batch of a run of model ``name``, checked before any work.

    A batch larger than the ``num_train`` training images is one batch of all of them: it is
    cut to them (to a multiple of the devices with ``sync_bn``, for equal shards), and
    ``note`` says so (None otherwise). On CPU contexts the batch's estimated peak memory
    (``MEMORY``) must fit in the memory available (``check_memory``): past it the system
    swaps or kills the run.

    Parameters
    ----------
    name : str
        A key of ``MODELS``.
    devices : list of Context
        The devices the batch is split across.
    num_train : int
        Training images of the run.
    batch_size : int, optional
        Samples per batch; None: the model's recipe, its samples per device times the devices.
    sync_bn : bool
        BatchNorm synchronised across the devices (equal shards, more memory).
    memory : bool
        Check the memory now; False leaves it to a later ``check_batch_memory``.

    Raises
    ------
    DeviceError
        A batch smaller than the devices (it cannot be split), or too large for the memory.
    """
    count, default = len(devices), batch_size is None
    batch_size = RECIPES[name].batch_size(count) if default else batch_size
    if batch_size < count:
        raise DeviceError(f'a batch of {batch_size} cannot be split across {count} devices; '
                          f'use `batch_size` {count} or more')
    multiple, note = count if sync_bn else 1, None
    if batch_size > num_train >= count:
        given = f'the default batch of {batch_size}' if default else f'`batch_size` {batch_size}'
        batch_size = num_train - num_train % multiple
        note = (f'{given} is more than the {num_train} training images: using a batch of '
                f'{batch_size}')
    if memory:
        check_batch_memory(name, devices, batch_size, sync_bn)
    return batch_size, note


def check_batch_memory(name, devices, batch_size, sync_bn=False):
    """On CPU contexts, raise ``DeviceError`` unless ``batch_size`` fits in the memory available."""
    if devices[0].device_type == 'cpu':
        check_memory(name, batch_size, len(devices), _devices.available_memory(),
                     len(devices) if sync_bn else 1, sync_bn)

"""Mixed precision: float16 on GPUs (float32 master weights, loss scaling); bfloat16 on CPUs.

With ``dtype`` float16 the network computes in float16 (BatchNorm keeps its
parameters in float32: Gluon's ``BatchNorm.cast`` does so), the optimizer keeps
a float32 copy of every weight (``multi_precision``), and the loss is scaled
before the backward pass so that small gradients do not vanish in float16;
``trainer.step`` divides the scale out again. A step whose gradients overflow
is skipped and the scale halved (``LossScaler``).

float16 is refused on CPU contexts (MXNet 1.9.1: "FP16 gemm on cpu not
implemented"). bfloat16 is for CPU contexts with oneDNN's bfloat16 kernels
(``check_bfloat16``): the network compiled as one graph, converted by
``amp.convert_symbol``, run as a ``SymbolBlock`` sharing its float32
parameters, the master weights (``Bfloat16``); no loss scaling.
"""
import contextlib
import functools
import os
import sys
import threading
import warnings

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import autograd, gluon, np

from ..errors import DeviceError, GluonMultiGPUError, SettingWarning
from ..base import machine, values
from ..machinery.training import Hook

__all__ = ['check_dtype', 'check_bfloat16', 'cpu_bfloat16', 'bfloat16_outlook', 'SPEEDUP',
           'LossScaler', 'MixedPrecision', 'Bfloat16', 'make_precision', 'all_finite']


def check_dtype(dtype, devices):
    """Raise ``GluonMultiGPUError`` unless ``train`` can compute in ``dtype`` on ``devices``."""
    values.known(dtype, values.DTYPES, 'dtype')
    if dtype == 'float16' and (cpus := [str(d) for d in devices if d.device_type != 'gpu']):
        raise DeviceError(f'`dtype` float16 needs GPUs, and {cpus[0]} is a CPU context: MXNet '
                          '1.9.1 has no float16 matrix multiply on the CPU ("FP16 gemm on cpu not '
                          'implemented"); use `dtype` float32 on CPU contexts')
    if dtype == 'bfloat16' and (gpus := [str(d) for d in devices if d.device_type == 'gpu']):
        raise DeviceError(f'`dtype` bfloat16 needs CPU contexts, and {gpus[0]} is a GPU: MXNet '
                          '1.9.1 trains in bfloat16 with oneDNN, on the CPU only; use `dtype` '
                          'float16 on GPUs')
    if dtype == 'bfloat16':
        check_bfloat16()


#: bfloat16 images/s over float32 to expect where the CPU has bfloat16 instructions: the medians
#: of tools/bfloat16_train.py on two contexts, batch 128, a 2-core AMD EPYC with AVX512_BF16
#: (docs/results/bfloat16-train.json; tests/training/test_bfloat16.py holds these to it).
SPEEDUP = {'resnet18': 1.9, 'simple-cnn': 1.2}


def cpu_bfloat16(flags=None, environ=None):
    """Whether this CPU has bfloat16 instructions for oneDNN, and a phrase naming what it has or
    lacks (``flags``: /proc/cpuinfo's, ``environ``: oneDNN's variables; default: this
    machine's). AVX-512 without them: oneDNN emulates bfloat16, no faster than float32."""
    flags = machine.cpu_flags() if flags is None else flags
    native = [f for f in ('avx512_bf16', 'amx_bf16') if f in flags]
    if not flags:
        return False, "the system does not list the CPU's features"
    if 'avx512f' not in flags:
        return False, 'the CPU lacks AVX-512: no avx512f among its /proc/cpuinfo flags'
    # DNNL_MAX_CPU_ISA: oneDNN 2.4's name (it ignores ONEDNN_MAX_CPU_ISA)
    if limit := (os.environ if environ is None else environ).get('DNNL_MAX_CPU_ISA'):
        return False, f'the CPU has AVX-512, but oneDNN is held to {limit} (DNNL_MAX_CPU_ISA)'
    return bool(native), f"the CPU lists avx512f and {native[0]}" if native else \
        'the CPU lacks avx512_bf16'


def check_bfloat16():
    """Raise ``DeviceError`` unless this CPU computes convolutions and dense layers in bfloat16.

    MXNet 1.9.1 computes them in bfloat16 with oneDNN kernels that exist only
    for some instruction sets (AVX-512; natively with AVX512_BF16): on a CPU
    with AVX2 alone, as many AMD EPYCs, oneDNN has none, and MXNet says so
    only when the operator runs ("could not create a primitive descriptor
    iterator"). So this runs the smallest graph of the kind ``Bfloat16``
    trains, forward and backward, on ``cpu()``; tried once per process.
    """
    if reason := _bfloat16_failure():
        raise DeviceError(f'this CPU cannot compute in bfloat16 ({cpu_bfloat16()[1]}; oneDNN\'s '
                          f'bfloat16 convolution failed with "{reason}"): train in `dtype` '
                          'float32 here')


def bfloat16_outlook():
    """What the doctor says of bfloat16 here: whether it trains (its kernels tried), the CPU's
    part (``cpu_bfloat16``), and the speed-ups over float32 to expect (``SPEEDUP``, or none)."""
    native, phrase = cpu_bfloat16()
    trains = not (failure := _bfloat16_failure())
    return {'trains': trains, 'native': native, 'cpu': phrase, 'error': failure or None,
            'speedup': SPEEDUP if trains and native else None}


@functools.lru_cache(maxsize=None)
def _bfloat16_failure():
    """The first line of MXNet's error for a bfloat16 convolution and dense layer, or ''.

    MXNet also logs the failure on the process's stderr: silenced here (``_silent_stderr``).
    """
    from mxnet.contrib.amp.amp import bfloat16  # the dtype ``amp_cast`` takes (not NumPy's)
    data, weight, dense = mx.sym.var('data'), mx.sym.var('weight'), mx.sym.var('dense')
    bf16 = functools.partial(mx.sym.amp_cast, dtype=bfloat16)
    conv = mx.sym.Convolution(bf16(data), bf16(weight), kernel=(3, 3), num_filter=4, no_bias=True)
    out = mx.sym.FullyConnected(conv, bf16(dense), num_hidden=2, no_bias=True)
    out = mx.sym.amp_cast(out, dtype='float32')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the parameters' types are known once they exist
        block = gluon.SymbolBlock(out.as_np_ndarray(), [data.as_np_ndarray()])
    with _silent_stderr():
        try:
            block.initialize(mx.init.Constant(0.5), ctx=mx.cpu())
            with autograd.record():
                y = block(np.ones((2, 3, 6, 6), ctx=mx.cpu()))
            y.backward()
            for array in [y] + [p.grad() for p in block.collect_params().values()]:
                array.wait_to_read()  # Sync point: oneDNN refuses only when the operator runs
        except mx.MXNetError as e:
            _drain_engine_errors()
            return str(e).splitlines()[0].replace('MXNetError: ', '') or type(e).__name__
    return ''


@contextlib.contextmanager
def _silent_stderr():
    """The process's stderr (descriptor 2, where MXNet's C++ logs) at the null device within
    (a closed descriptor 2, as after ``2>&-``, stays closed)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # none, or closed
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, 'wb') as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _drain_engine_errors(limit=64):
    """Wait for every queued operator and take each error it left in the engine.

    The other operators of a failed graph (the dense layer, the backward
    pass) may fail too, later, on the engine's threads; the engine keeps
    those errors and raises one per wait, the last at interpreter exit
    ("Exception ignored in atexit callback"). Sync point, once per failure.
    """
    for _ in range(limit):
        with contextlib.suppress(mx.MXNetError):
            mx.npx.waitall()
            return


def all_finite(params, devices):
    """Whether every gradient of ``params`` on ``devices`` is finite (sync point: one read-back).

    Each gradient is summed in float32, so that float16 gradients do not
    overflow in the sum where they did not overflow themselves.
    """
    sums = [np.sum(p.grad(d), dtype='float32').as_in_ctx(devices[0])
            for p in params if p.grad_req != 'null' for d in devices]
    return bool(np.isfinite(np.stack(sums).sum()).item())


class LossScaler:
    """Dynamic loss scaling: the loss times ``scale`` in the backward pass, divided out in the step.

    An overflow (a gradient that is not finite on some device) skips the
    step and divides the scale by ``factor``; ``window`` steps in a row
    without one multiply it by ``factor``. With powers of two the scaling
    itself is exact: in float32 a scaled step equals an unscaled one.

    Parameters
    ----------
    scale : float
        The first scale (2**15, as in MXNet's AMP).
    factor : float
        How much an overflow lowers the scale and a quiet window raises it (above 1).
    window : int
        Steps without overflow before the scale grows.
    min_scale : float
        The scale never drops below this.
    """

    def __init__(self, scale=2.0 ** 15, factor=2.0, window=2000, min_scale=1.0):
        if not (scale > 0 and factor > 1 and window >= 1 and min_scale > 0):
            raise GluonMultiGPUError('a loss scaler needs scale > 0, factor > 1, window >= 1 '
                                     'and min_scale > 0')
        self.scale, self.factor, self.window, self.min_scale = scale, factor, window, min_scale
        self.skipped = self._quiet = 0  # ``_quiet``: steps in a row without an overflow
        self.params = []  # the parameters whose gradients are checked (``MixedPrecision.prepare``)

    def backward(self, loss):
        """``loss.backward()`` with the loss multiplied by the scale."""
        loss.backward(out_grad=np.full(loss.shape, self.scale, dtype=loss.dtype, ctx=loss.ctx))

    def step(self, trainer, batch_size, devices):
        """Update with the gradients unscaled, or skip an overflowing step; return whether updated.

        Sync point: the gradients' finiteness is read back before the update.
        """
        if not all_finite(self.params, devices):
            self.scale = max(self.min_scale, self.scale / self.factor)
            self.skipped, self._quiet = self.skipped + 1, 0
            return False
        trainer.step(batch_size * self.scale)  # divides the gradients by the batch and the scale
        self._quiet += 1
        if self._quiet >= self.window:
            self.scale, self._quiet = self.scale * self.factor, 0
        return True


class Cast(gluon.nn.Block):
    """Run ``net`` in ``dtype`` on its inputs cast to it; give back float32 outputs for the loss.

    The network is cast on the first call: parameters whose shape waits for
    the first input (deferred initialisation) are first made in float32 by a
    forward pass of one sample in predict mode, because MXNet 1.9.1's random
    initialisers cannot fill float16 parameters in NumPy mode. ``net`` keeps
    its parameter names, so checkpoints are those of the float32 network.
    """

    def __init__(self, net, dtype):
        super().__init__()
        self.net, self.dtype, self.cast_done = net, dtype, False

    def forward(self, X):  # pylint: disable=arguments-differ
        if not self.cast_done:
            with autograd.pause(train_mode=False):
                self.net(X[:1])  # every parameter exists, in float32
            self.net.cast(self.dtype)  # BatchNorm keeps float32 (Gluon's BatchNorm.cast)
            self.cast_done = True
        return self.net(X.astype(self.dtype, copy=False)).astype('float32', copy=False)


def _as_hybrid(block):
    """The same blocks (and parameters) under ``HybridSequential`` containers: one graph."""
    if isinstance(block, gluon.nn.Sequential):
        hybrid = gluon.nn.HybridSequential(prefix=block.prefix)
        for child in block._children.values():  # pylint: disable=protected-access
            hybrid.add(_as_hybrid(child))
        return hybrid
    if not isinstance(block, gluon.nn.HybridBlock):
        raise GluonMultiGPUError(f'`dtype` bfloat16 converts the compiled graph of the network, '
                                 f'and its {type(block).__name__} is not a HybridBlock (the '
                                 "text's nn.Block residuals are not); use a hybridizable network")
    return block


#: NumPy-mode operators kept in float32 when only convolutions and dense layers compute in
#: bfloat16 (``Bfloat16(conv_only=True)``); AMP's lists do not name them.
CONV_ONLY_FP32 = ('BatchNorm', 'Pooling', '_npx_relu', '_npi_add')


def _converted(net, X, conv_only=False):
    """``net``'s graph for inputs like ``X``, converted by ``amp.convert_symbol`` to compute in
    bfloat16, as a NumPy-mode ``SymbolBlock`` that shares ``net``'s float32 parameters."""
    from mxnet.contrib import amp  # pylint: disable=import-outside-toplevel
    from mxnet.contrib.amp.lists import symbol_bf16  # pylint: disable=import-outside-toplevel
    with autograd.pause(train_mode=False):
        net(X[:1])  # every parameter exists, in float32 (deferred shapes)
    inputs, graph = _as_hybrid(net)._get_graph(X)  # pylint: disable=protected-access
    known, fp32_ops, conditional = list(symbol_bf16.FP32_FUNCS), None, None
    if conv_only:
        fp32_ops = known + [op for op in CONV_ONLY_FP32 if op not in known]
        conditional = [('Activation', 'act_type', ['softrelu', 'relu'])]
        symbol_bf16.FP32_FUNCS[:] = fp32_ops  # convert_symbol takes only its lists' operators
    try:
        graph = amp.convert_symbol(graph, target_dtype='bfloat16', fp32_ops=fp32_ops,
                                   data_names=[i.name for i in inputs],
                                   conditional_fp32_ops=conditional)
    finally:
        symbol_bf16.FP32_FUNCS[:] = known
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        block = gluon.SymbolBlock(graph.as_np_ndarray(), [i.as_np_ndarray() for i in inputs],
                                  params=net.collect_params())
    block.hybridize(static_alloc=True)
    return block


class Bfloat16(gluon.nn.Block):
    """Run ``net`` as its graph converted to bfloat16; float32 parameters, gradients, outputs.

    Converted on the first call (under a lock: every device's thread calls it).
    """

    def __init__(self, net, conv_only=False):
        super().__init__()
        self.net, self.conv_only, self._lock = net, conv_only, threading.Lock()
        self.__dict__['converted'] = None  # not a child: its parameters are ``net``'s

    def forward(self, X):  # pylint: disable=arguments-differ
        if self.converted is None:
            with self._lock:
                if self.converted is None:
                    self.__dict__['converted'] = _converted(self.net, X, self.conv_only)
        return self.converted(X)


class MixedPrecision(Hook):
    """How ``train`` computes in ``dtype``: the network cast, the optimizer's float32 copies,
    and a ``LossScaler`` (a new one by default).

    A plug-in of ``train``: pass it in ``hooks`` (``hooks=[MixedPrecision('float16')]``,
    or ``make_precision(dtype, devices)``, which is None for float32).

    ``MixedPrecision('float32', LossScaler(...))`` runs the loss scaling alone,
    in float32: what the tests check on CPU contexts.
    """

    def __init__(self, dtype='float16', scaler=None):
        values.known(dtype, values.DTYPES, 'dtype')
        # bfloat16 has float32's range: its gradients need no scaling
        self.dtype, self.scaler = dtype, scaler or (None if dtype == 'bfloat16' else LossScaler())

    def setup(self, run):
        """Plug into ``run``'s step: the cast network, the scaler, float32 master weights."""
        check_dtype(self.dtype, run.devices)
        if self.dtype == 'bfloat16' and not (found := cpu_bfloat16())[0]:
            warnings.warn(SettingWarning(f'`dtype` bfloat16 on a CPU without bfloat16 '
                                         f'instructions ({found[1]}): oneDNN emulates them, '
                                         'expect no speed-up over float32'))
        run.plug('model', self.prepare(run.net), self)
        if self.scaler is not None:
            run.plug('scaler', self.scaler, self)
        if self.dtype == 'float16':  # the optimizer keeps float32 master copies of the weights
            run.trainer_options['multi_precision'] = True

    def prepare(self, net):
        """Return the block to call in training: ``net`` cast to the compute type (on its first
        call, see ``Cast``; for bfloat16 its converted graph, ``Bfloat16``), and the loss
        scaler told which gradients to check."""
        if self.scaler is not None:
            self.scaler.params = [p for p in net.collect_params().values() if p.grad_req != 'null']
        if self.dtype == 'bfloat16':
            return Bfloat16(net)
        return net if self.dtype == 'float32' else Cast(net, self.dtype)


def make_precision(precision, devices):
    """Return the ``MixedPrecision`` for ``precision`` (a dtype name or one), None for float32.

    Raises ``GluonMultiGPUError`` when it does not apply to ``devices``.
    """
    if precision is None or precision == 'float32':
        return None
    precision = precision if isinstance(precision, MixedPrecision) else MixedPrecision(precision)
    check_dtype(precision.dtype, devices)
    return precision

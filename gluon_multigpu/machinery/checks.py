"""What ``train`` checks before it works: its arguments, and the data as the network sees it.

Every refusal is a one-line ``GluonMultiGPUError`` that names the value and
says what to give instead. The arguments are checked before anything is
made (``devices.check_devices``, ``kvstores.check_kvstore``); the data where
it is already on the host, so that no check adds a wait on the devices to a
step (``BatchCheck``): the labels of the package's loaders once, as a whole,
labels in NumPy arrays in every batch, and those in MXNet arrays in each
epoch's first batch; the shape of each epoch's first batch by one forward
pass of a single sample, whose output also says how many classes the
network has. Every batch is checked to be a pair ``(X, y)`` whose samples
are shaped like the first one's, from shapes Python already holds.
"""

import numpy as onp

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import autograd

from ..base import compat
from ..errors import DataError, DeviceError, GluonMultiGPUError
from ..section.steps import batch_pair, check_whole

__all__ = ['check_split', 'BatchCheck']


def check_split(devices, split=None):
    """Raise ``DeviceError`` unless ``split``'s weights (if weights) are one per device."""
    if isinstance(split, (list, tuple)) and len(split) != len(devices):
        raise DeviceError(f'`split` gives {len(split)} weights for {len(devices)} devices; give '
                          'one weight per device')


def check_labels(labels, num_classes, where):
    """Raise ``DataError`` if a label of ``labels`` is not a class 0..n-1 (an MXNet array is
    read back)."""
    labels = check_whole(labels, where)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        bad = labels.min() if labels.min() < 0 else labels.max()
        raise DataError(f'label {bad.item()!r} in {where} is outside the network\'s '
                        f'{num_classes} classes; give class numbers 0 to {num_classes - 1}')


class BatchCheck:
    """Checks the batches of a run as ``train_epoch`` takes them (see the module's text).

    Parameters
    ----------
    model : Block
        What computes a step (the network, or a cast of it).
    device : Context
        Where the one-sample forward pass of an epoch's first batch runs.
    data : iterable
        The training data: a loader of the package holds its labels on the
        host (``labels``), checked as a whole once.
    """

    def __init__(self, model, device, data=None):
        self.model, self.device, self.data = model, device, data
        self.num_classes, self.sample_shape, self._loader_checked = None, None, False

    def __call__(self, batch, first):
        """Return ``(X, y)`` of ``batch``; ``first``: the first batch of an epoch."""
        X, y = batch_pair(batch)
        if not (hasattr(X, 'shape') and hasattr(y, 'shape')):
            raise DataError(f'a batch of a {type(X).__name__} and a {type(y).__name__}; give '
                            'arrays (inputs, labels)')
        if first:
            self.sample_shape = tuple(X.shape[1:])
            self._probe(X)
        elif tuple(X.shape[1:]) != self.sample_shape:
            raise DataError(f'a batch of inputs shaped {tuple(X.shape)} after batches of samples '
                            f'shaped {self.sample_shape}; give every batch samples of one shape')
        if len(y.shape) != 1 or y.shape[0] != X.shape[0]:
            raise DataError(f'labels of shape {tuple(y.shape)} for {X.shape[0]} inputs; give '
                            'one class number per sample, shape (batch,)')
        if self.num_classes is not None:
            labels = getattr(self.data, 'labels', None)
            if isinstance(labels, onp.ndarray):  # a package loader: all its labels, once
                if not self._loader_checked:
                    check_labels(labels, self.num_classes, 'the training data')
                    self._loader_checked = True
            elif first or isinstance(y, onp.ndarray):
                # Labels already on the host (NumPy) cost a min and a max: every batch. Those
                # in MXNet arrays would cost a wait for the array: an epoch's first batch only.
                # (an MXNet array is read back: the first batch only)
                check_labels(y, self.num_classes, 'the training data')
        return X, y

    def _probe(self, X):
        """Run one sample through the model: the shape it takes and the classes it has.

        MXNet prints the arguments of a shape it cannot infer, then raises: the
        error says it, and ``compat.quiet`` keeps the print out (in this thread only).
        """
        try:
            with autograd.predict_mode(), compat.quiet():
                sample = X[:1]  # a NumPy batch too, as split_and_load takes it
                out = self.model(sample.as_in_ctx(self.device) if hasattr(sample, 'as_in_ctx')
                                 else mx.np.array(sample, ctx=self.device))
        except GluonMultiGPUError:  # a layer's own check (a ValueError too): as it says
            raise
        except AttributeError as e:  # a layer of the legacy API in NumPy mode
            raise GluonMultiGPUError(
                'the network cannot run with MXNet\'s NumPy semantics (it was built in a '
                'thread where mxnet.npx.set_np() was not called); build it where it was, '
                'as the package\'s builders do') from e
        except (mx.base.MXNetError, ValueError) as e:  # ValueError: deferred initialisation
            raise DataError(f'the network cannot take inputs of shape {tuple(X.shape)} '
                            f'(samples shaped {tuple(X.shape[1:])}); give it inputs of the '
                            'shape it was built for') from e
        self.num_classes = out.shape[-1] if len(out.shape) == 2 else None

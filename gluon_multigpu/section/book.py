"""The text's training loop and evaluation (d2l 13.6), for teaching and for the speed comparison.

``train_book`` is the section's ``train``: ``resnet18`` built from the
``nn.Block`` ``Residual`` and run eagerly, each batch split with
``split_batch``, ``trainer.step(batch_size)``, ``npx.waitall()`` before the
timer stops, and the text's ``evaluate_accuracy_gpus``, which reads back every
shard. Its epoch has no read-back and computes no training loss or accuracy.
``training.train`` is the fast path with the same arithmetic.
"""
from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import autograd, gluon, init, npx

from .devices import check_devices, split_batch
from ..errors import Interrupted
from .kvstores import check_kvstore, kvstore_name, make_trainer
from .model import text_resnet18 as resnet18
from .results import EpochRecord, TrainResult
from .steps import check_finite_params
from .utils import Accumulator, Timer, accuracy
from ..base.values import check_epochs, check_lr

__all__ = ['resnet18', 'evaluate_accuracy_book', 'train_epoch_book', 'train_book', 'book_epochs']


def evaluate_accuracy_book(net, data_iter, split_f=split_batch):
    """Compute the accuracy of ``net`` on several devices, line for line as the text does."""
    # Query the list of devices
    devices = list(net.collect_params().values())[0].list_ctx()
    metric = Accumulator(2)  # num_corrected_examples, num_examples
    for features, labels in data_iter:
        X_shards, y_shards = split_f(features, labels, devices)
        # Run in parallel
        pred_shards = [net(X_shard) for X_shard in X_shards]
        # Sync point per shard: float() waits for the prediction
        metric.add(sum(float(accuracy(pred_shard, y_shard)) for
                       pred_shard, y_shard in zip(pred_shards, y_shards)), labels.size)
    return metric[0] / metric[1]


def train_epoch_book(net, train_iter, loss, trainer, devices, batch_size=None):
    """One epoch of the text's loop; return the samples seen (counted on the host, no sync).

    The caller stops its timer after ``npx.waitall()``, as the text does.
    """
    samples = 0
    for features, labels in train_iter:
        X_shards, y_shards = split_batch(features, labels, devices)
        with autograd.record():
            losses = [loss(net(X_shard), y_shard) for X_shard, y_shard in zip(X_shards, y_shards)]
        for l in losses:
            l.backward()
        trainer.step(batch_size or features.shape[0])
        samples += features.shape[0]
    return samples


class _UntilStopped:
    """An epoch's batches until ``stop()`` says to stop: asked before each step, on the host.

    The next batch is drawn before ``stop`` is asked, so a stop after the
    epoch's last step is seen to be the epoch's end (``stopped`` stays False).
    """

    def __init__(self, batches, stop):
        self.batches, self.stop, self.count, self.stopped = batches, stop, 0, False

    def __iter__(self):
        for batch in self.batches:
            if self.stop():
                self.stopped = True
                return
            self.count += 1
            yield batch


def train_book(net, train_iter, test_iter, devices, num_epochs=10, lr=0.1, kvstore='device',
               batch_size=None, seed=None, initializer=None, on_epoch=None, stop=None):
    """Train with the text's loop; return a ``TrainResult`` like ``train``.

    The loop is the text's (its epoch is ``train_epoch_book``), with four
    additions that queue no work on the devices: the samples are counted
    (for samples/s), each epoch is handed
    to ``on_epoch`` in place of the text's plot, after the timer stops the
    parameters are checked to be finite (one read-back), so a diverged run
    stops with ``TrainingDiverged``, and ``stop`` is asked between steps.

    Parameters
    ----------
    net : Block
        Typically ``resnet18(10)``; never hybridized here.
    train_iter, test_iter : iterable of (X, y)
        Batches of features and class labels.
    devices : list of Context
        Distinct devices that exist; each batch is split evenly across them.
    num_epochs : int
        Epochs to train.
    lr : float
        SGD learning rate, positive.
    kvstore : {'local', 'device', 'nccl', 'none', None} or KVStore
        Where gradients are summed (``kvstores.make_trainer``); the text uses the
        Trainer's default, ``device``.
    batch_size : int, optional
        Passed to ``trainer.step`` as the text does; None: each batch's size.
    seed : int, optional
        Seeds MXNet's generators before initialisation (None: not seeded).
    initializer : Initializer, optional
        None: the text's ``init.Normal(sigma=0.01)``.
    on_epoch : callable, optional
        Called with each ``EpochRecord`` (``train_loss`` and ``train_acc`` None).
    stop : callable, optional
        Asked (a Python flag, no wait for the devices) after every step and every epoch,
        e.g. a ``stopping.StopRequest``: True ends the run there with ``Interrupted``, once
        the queued steps have finished. A stop in an epoch's last step or its evaluation
        ends the run at that epoch's end (``Interrupted.epoch_done``); after the last
        epoch the run simply ends.

    Returns
    -------
    TrainResult
        The test accuracy, seconds and samples of every epoch, the devices and kvstore.
    """
    return list(book_epochs(net, train_iter, test_iter, devices, num_epochs, lr, kvstore,
                            batch_size, seed, initializer, on_epoch, stop))[-1]  # the last epoch's


def book_epochs(net, train_iter, test_iter, devices, num_epochs=10, lr=0.1, kvstore='device',
                batch_size=None, seed=None, initializer=None, on_epoch=None, stop=None):
    """``train_book`` an epoch at a time: a generator of the ``TrainResult`` after each epoch.

    The arguments are ``train_book``'s; the checks (each raising the one-line
    ``GluonMultiGPUError`` before any work) and the initialisation run at the
    first ``next``. A comparison takes the runs of several kvstores in turn
    this way, epoch after epoch.
    """
    devices = check_devices(devices)
    num_epochs = check_epochs(num_epochs) if num_epochs is not None else None
    check_kvstore(kvstore, devices)
    lr = check_lr(lr) if lr is not None else None
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(init=initializer or init.Normal(sigma=0.01), ctx=devices, force_reinit=True)
    trainer = make_trainer(net, lr, kvstore)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    timer = Timer()
    result = TrainResult(devices=[str(d) for d in devices], kvstore=kvstore_name(kvstore), lr=lr)
    for epoch in range(num_epochs):
        batches = train_iter if stop is None else _UntilStopped(train_iter, stop)
        timer.start()
        samples = train_epoch_book(net, batches, loss, trainer, devices, batch_size)
        npx.waitall()
        timer.stop()
        if stop is not None and batches.stopped:  # stopped part-way
            raise Interrupted(epoch + 1, batches.count)
        check_finite_params(net, f' in epoch {epoch + 1}; lower the learning rate (it is {lr})')
        tic = Timer()
        test_acc = evaluate_accuracy_book(net, test_iter)
        record = EpochRecord(epoch + 1, None, None, test_acc, timer.times[-1], tic.stop(), samples)
        result.epochs.append(record)
        if on_epoch is not None:  # the package's stand-in for the text's plot of the test accuracy
            on_epoch(record)
        if stop is not None and stop() and epoch + 1 < num_epochs:
            raise Interrupted(epoch + 1, batches.count, epoch_done=True)
        yield result

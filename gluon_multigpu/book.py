"""The text's training loop and evaluation verbatim, for teaching and for the speed comparison.

``train_book`` is the loop of d2l 13.6 (an ``nn.Block`` model run eagerly,
the same step as ``training.train_batch`` with ``trainer.step(batch_size)``),
with the loss and accuracy read back to the host after every step as the
book's other training loops do, and the text's ``evaluate_accuracy_gpus``,
which reads back every shard. Each
read-back is a host-device sync point; ``training.train`` is the fast path
with the same arithmetic.
"""
from . import _mxnet  # noqa: F401  (engine settings, then MXNet in NumPy mode)
from mxnet import npx

from .devices import split_batch
from .training import DivergenceWatch, EpochTotals, fit, train_batch
from .utils import Accumulator, Timer, accuracy

__all__ = ['evaluate_accuracy_book', 'train_epoch_book', 'train_book']


def evaluate_accuracy_book(net, data_iter, split_f=split_batch):
    """Compute the accuracy of ``net`` on several devices, line for line as the text does."""
    # Query the list of devices
    devices = list(net.collect_params().values())[0].list_ctx()
    # No. of correct predictions, no. of predictions
    metric = Accumulator(2)
    for features, labels in data_iter:
        X_shards, y_shards = split_f(features, labels, devices)
        # Run in parallel
        pred_shards = [net(X_shard) for X_shard in X_shards]
        # Sync point per shard: float() waits for the prediction
        metric.add(sum(float(accuracy(pred_shard, y_shard)) for
                       pred_shard, y_shard in zip(pred_shards, y_shards)), labels.size)
    return metric[0] / metric[1]


def train_epoch_book(net, train_iter, loss, trainer, devices, batch_size=None, *,
                     should_stop=None, first_step=1):
    """Train one epoch with the text's loop; return its ``EpochTotals``.

    ``should_stop`` and ``first_step`` are those of ``training.train_epoch``;
    a non-finite loss or parameter raises ``TrainingDiverged`` naming its step.
    """
    timer = Timer()
    metric = Accumulator(3)  # loss sum, correct predictions, samples
    watch = DivergenceWatch(net, devices[0], first_step)
    batches, stopped = 0, False
    for features, labels in train_iter:
        stats = train_batch(net, features, labels, loss, trainer, devices, batch_size)
        watch.add([l for l, _ in stats])
        # Sync point per step: read the loss and accuracy back to the host.
        metric.add(sum(float(l) for l, _ in stats), sum(float(c) for _, c in stats),
                   features.shape[0])
        batches += 1
        if should_stop is not None and should_stop():
            stopped = True
            break
    npx.waitall()
    watch.check()
    return EpochTotals(metric[0], metric[1], int(metric[2]), timer.stop(), batches, stopped)


def train_book(net, train_iter, test_iter, devices, num_epochs=10, lr=0.1, kvstore='device',
               batch_size=None, seed=None, initializer=None, on_epoch=None, *, checkpoint=None,
               resume=False, should_stop=None):
    """Train with the text's loop; return a ``TrainResult`` like ``train``.

    Parameters
    ----------
    net : Block
        Typically ``book_resnet18(10)``; never hybridized here.
    train_iter, test_iter : iterable of (X, y)
    devices : list of Context
    num_epochs : int
    lr : float
    kvstore : {'local', 'device', 'nccl', 'none', None}
        The text uses the Trainer's default, ``device``.
    batch_size : int, optional
        Passed to ``trainer.step`` as the text does; defaults to each batch's size.
    seed : int, optional
        Seeds MXNet's generators before initialisation.
    initializer : Initializer, optional
        Defaults to the text's ``init.Normal(sigma=0.01)``.
    on_epoch : callable, optional
        Called with each ``EpochRecord``.
    checkpoint, resume, should_stop
        As for ``training.train``.
    """
    def run_epoch(epoch, net, data, loss, trainer, devices, stop, first_step):  # noqa: ARG001
        return train_epoch_book(net, data, loss, trainer, devices, batch_size,
                                should_stop=stop, first_step=first_step)
    return fit(net, train_iter, test_iter, devices, run_epoch, evaluate_accuracy_book,
               num_epochs=num_epochs, lr=lr, kvstore=kvstore, seed=seed,
               initializer=initializer, hybrid=False, on_epoch=on_epoch, checkpoint=checkpoint,
               resume=resume, should_stop=should_stop)

"""A kvstore's run of a train command: its network, hooks and Training, built at its first turn.

``KvstoreRun`` builds them, with what every run of one command shares given first;
``train(epochs)`` trains more, so that the runs of a comparison
can take turns epoch after epoch (``comparison.Comparison``), each exactly
as alone.
"""
from ..base import engine
from ..base.compat import GPU_INSTALL
from ..section.book import book_epochs, resnet18 as book_resnet18
from ..section.data import DATASETS
from ..section.kvstores import kvstore_name
from ..section.model import default_initializer, get_model
from ..section.results import epoch_line
from ..machinery.training import Training
from ..features.balance import TimedSplit, make_split
from ..features.distributed import StepScale
from ..features.precision import make_precision
from ..features.sync_bn import sync_batch_norm
from ..observe.progress import Progress
from ..observe.stopping import StopRequest, say_quietly
from ..study.compare import fingerprint

__all__ = ['KvstoreRun', 'faster_advice']


class KvstoreRun:
    """A fresh model (or a resumed one) trained with one kvstore: ``train(epochs)`` trains more.

    Built whole at once (the network initialised, the Trainer made); each
    ``train`` goes on from where the last stopped, with this run's own
    sequence of batches, so that the runs of a comparison can take turns
    epoch after epoch and each train exactly as alone. Each epoch is printed;
    after it ``tracker`` records the parameters, for the comparison;
    ``schedule`` (a ``progress.Schedule``) holds the runs compared, for the
    progress lines' time left. The settings every run of one command shares come first
    (``functools.partial``), then the kvstore (a parameter server's worker takes its own).
    """

    def __init__(self, config, worker, devices, lr, train_iter, test_iter, out, tracker, hooks,
                 kvstore, schedule=None):
        self.train_iter, self.worker, self.result = train_iter, worker, None
        kvstore = worker.kvstore or kvstore
        train_iter.epoch = 0  # every kvstore sees the same sequence of batches
        classes = DATASETS[config.dataset]['classes']
        # --book-literal trains the text's own ResNet-18 (nn.Block residuals)
        net = (book_resnet18(classes) if config.book_literal and config.model == 'resnet18' else
               get_model(config.model, classes,
                         sync_batch_norm(len(devices)) if config.sync_bn else None))
        split = make_split(config.split)

        def on_epoch(record):
            # the workers must agree: with several, the line shows their parameters' fingerprint
            agreed = f', parameters {fingerprint(net)}' if worker.count > 1 else ''
            print(epoch_line(record, config.num_epochs) + agreed, file=out, flush=True)
            if isinstance(split, TimedSplit):
                print(f'  {split.summary()}', file=out, flush=True)
                split.reset_stats()
            tracker.record(kvstore_name(kvstore), record.epoch, net)

        initializer = default_initializer(config.model)
        self._book = self.training = None
        if config.book_literal:  # the text's loop, asking the stop request between steps
            stop = next((h for h in hooks if isinstance(h, StopRequest)), None)
            self._book = book_epochs(net, train_iter, test_iter, devices, config.num_epochs, lr=lr,
                                     batch_size=train_iter.batch_size, stop=stop, kvstore=kvstore,
                                     seed=config.seed, initializer=initializer, on_epoch=on_epoch)
            return
        label = (f'kvstore {kvstore_name(kvstore)} on {len(devices)} '
                 f'{devices[0].device_type.upper()}' + ('s' if len(devices) > 1 else ''))
        progress = Progress(say_quietly, config.progress_interval, label, config.num_epochs,
                            advice=faster_advice(config, devices), schedule=schedule)
        features = [split, make_precision(config.dtype, devices),
                    StepScale(kvstore, worker.count) if worker.count > 1 else None]
        self.training = Training(net, train_iter, test_iter, devices, initializer=initializer,
                                 config=config.training(kvstore, lr), on_epoch=on_epoch,
                                 hooks=[f for f in features if f is not None] + [*hooks, progress])

    def train(self, epochs):
        """Train ``epochs`` more epochs; return the ``TrainResult`` so far."""
        # This run's next epoch, whatever the other runs of a comparison trained meanwhile (a
        # checkpoint's resume sets it again, in the training's ``begin``).
        self.train_iter.epoch = len(self.result.epochs) if self.result is not None else 0
        if self._book is not None:
            for _ in range(epochs):
                self.result = next(self._book)
        else:
            self.result = self.training.fit(epochs)
        self.result.workers = self.worker.count
        return self.result


def faster_advice(config, devices):
    """What to try when a run would take long: a smaller model, more contexts, GPUs."""
    cpu, cores = devices[0].device_type == 'cpu', max(2, engine.cores())
    options = ((config.model != 'simple-cnn', '--model simple-cnn trains about 60 times faster'),
               (cpu and len(devices) < cores, f'--cpu-devices {cores} uses every core'),
               (cpu, f'a machine with GPUs takes seconds per epoch ({GPU_INSTALL})'),
               (True, '--num-train N trains on a subset'))
    return 'faster: ' + '; '.join(advice for wanted, advice in options if wanted)

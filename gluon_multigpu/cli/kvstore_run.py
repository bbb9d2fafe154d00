"""A kvstore's run of a train command: its network, hooks and Training, built at its first turn.

``RunMaker`` builds them with what every run of one command shares;
``KvstoreRun.train(epochs)`` trains more, so that the runs of a comparison
can take turns epoch after epoch (``comparison.Comparison``), each exactly
as alone.
"""
from .console import cores, say_quietly
from ..base.compat import GPU_INSTALL
from ..core.book import book_epochs, resnet18 as book_resnet18
from ..core.data import DATASETS
from ..core.kvstores import kvstore_name
from ..core.model import default_initializer, get_model
from ..core.results import epoch_line
from ..core.training import Training
from ..features.balance import TimedSplit, make_split
from ..features.distributed import StepScale
from ..features.precision import make_precision
from ..features.sync_bn import sync_batch_norm
from ..run.progress import Progress
from ..run.stopping import StopRequest
from ..study.compare import fingerprint

__all__ = ['RunMaker', 'KvstoreRun', 'faster_advice']


class RunMaker:
    """``maker(kvstore, schedule=None)``: a ``KvstoreRun`` of one command's kvstore, with the
    settings every run of the command shares (given once, here)."""

    def __init__(self, args, worker, devices, lr, train_iter, test_iter, out, tracker, hooks):
        self.args, self.worker, self.devices, self.lr = args, worker, devices, lr
        self.train_iter, self.test_iter, self.out = train_iter, test_iter, out
        self.tracker, self.hooks = tracker, hooks

    def __call__(self, kvstore, schedule=None):
        return KvstoreRun(self.args, self.worker.kvstore or kvstore, self.devices, self.lr,
                          self.train_iter, self.test_iter, self.out, self.tracker, self.hooks,
                          self.worker, schedule)


class KvstoreRun:
    """A fresh model (or a resumed one) trained with one kvstore: ``train(epochs)`` trains more.

    Built whole at once (the network initialised, the Trainer made); each
    ``train`` goes on from where the last stopped, with this run's own
    sequence of batches, so that the runs of a comparison can take turns
    epoch after epoch and each train exactly as alone. Each epoch is printed;
    after it ``tracker`` records the parameters, for the comparison;
    ``schedule`` (a ``progress.Schedule``) holds the runs compared, for the
    progress lines' time left.
    """

    def __init__(self, args, kvstore, devices, lr, train_iter, test_iter, out, tracker,
                 hooks=(), worker=None, schedule=None):
        self.train_iter, self.worker, self.result = train_iter, worker, None
        train_iter.epoch = 0  # every kvstore sees the same sequence of batches
        classes = DATASETS[args.dataset]['classes']
        if args.book_literal and args.model == 'resnet18':
            net = book_resnet18(classes)  # the text's: nn.Block residuals
        else:
            net = get_model(args.model, classes,
                            sync_batch_norm(len(devices)) if args.sync_bn else None)
        split = make_split(args.split)

        def on_epoch(record):
            line = epoch_line(record, args.num_epochs)
            if worker is not None and worker.count > 1:  # the workers must agree: show it
                line += f', parameters {fingerprint(net)}'
            print(line, file=out, flush=True)
            if isinstance(split, TimedSplit):
                print(f'  {split.summary()}', file=out, flush=True)
                split.reset_stats()
            tracker.record(kvstore_name(kvstore), record.epoch, net)

        settings = dict(lr=lr, kvstore=kvstore, seed=args.seed,
                        initializer=default_initializer(args.model), on_epoch=on_epoch)
        updates = dict(accumulate=args.accumulate, clip_grad_norm=args.clip_grad_norm,
                       lr_schedule=args.lr_schedule, warmup_steps=args.warmup_steps)
        self._book = self.training = None
        if args.book_literal:  # the text's loop, asking the stop request between steps
            stop = next((h for h in hooks if isinstance(h, StopRequest)), None)
            self._book = book_epochs(net, train_iter, test_iter, devices, args.num_epochs,
                                     batch_size=train_iter.batch_size, stop=stop, **settings)
            return
        label = (f'kvstore {kvstore_name(kvstore)} on {len(devices)} '
                 f'{devices[0].device_type.upper()}' + ('s' if len(devices) > 1 else ''))
        progress = Progress(say_quietly, args.progress_interval, label, args.num_epochs,
                            advice=faster_advice(args, devices), schedule=schedule)
        features = [split, make_precision(args.dtype, devices)]
        if worker and worker.count > 1:
            features.append(StepScale(kvstore, worker.count))
        self.training = Training(net, train_iter, test_iter, devices,
                                 hooks=[f for f in features if f is not None]
                                 + [*hooks, progress],
                                 max_in_flight=args.max_in_flight, **settings, **updates)

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
        self.result.workers = self.worker.count if self.worker else 1
        return self.result


def faster_advice(args, devices):
    """What to try when a run would take long: a smaller model, more contexts, GPUs."""
    options = []
    if args.model != 'simple-cnn':
        options.append('--model simple-cnn trains about 60 times faster')
    if devices[0].device_type == 'cpu' and len(devices) < max(2, cores()):
        options.append(f'--cpu-devices {max(2, cores())} uses every core')
    if devices[0].device_type == 'cpu':
        options.append(f'a machine with GPUs takes seconds per epoch ({GPU_INSTALL})')
    options.append('--num-train N trains on a subset')
    return 'faster: ' + '; '.join(options)

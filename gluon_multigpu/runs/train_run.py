"""What one train command does once parsed: the checks, the data, a training per kvstore.

Every check and setting of a run is the library's (``config.RunConfig``,
``recipes``, ``model.fit_batch``, ``sync_bn.check_training``,
``distributed.join``, ``checkpoint.for_run``, ``targets.check_outputs``); this
module chooses the hooks a ``RunConfig`` asks for and prints the lines, for
the train program or a notebook. It reads no argv: how its lines name the
programs is given (``run``). It loads MXNet: a program imports it once the
engine is set (``console.prepare_engine``).
"""
import contextlib
import functools
import os
import sys

from ..observe.stopping import StallGuard, launcher_stops, say_quietly
from .comparison import Comparison
from .kvstore_run import KvstoreRun
from ..machinery.checks import check_split
from ..section.data import DATASETS, input_files, load_data, synthetic_data
from ..section.devices import even_shares, resolve_devices, split_sizes
from ..section.kvstores import DIST_KVSTORES, check_kvstore
from ..observe.metrics import Metrics
from ..section.model import check_batch_memory, fit_batch
from ..section.recipes import RECIPES
from ..section.results import epoch_line
from ..observe.stall import STALLED, stall_hook, stall_line
from ..errors import GluonMultiGPUError, flag
from ..features.distributed import Control, join
from ..features.precision import check_dtype
from ..features.sync_bn import check_training
from ..checkpoints.checkpoint import for_run
from ..filesafety.targets import check_outputs as check_paths
from ..study.charts import check_chart_path
from ..study.compare import ParamTracker

__all__ = ['run', 'joining', 'worker_rank', 'per_device', 'RankPrefixed']


def check_run(config):
    """The checks of what the machine has (``config`` checked the rest when it was made);
    return ``(devices, batch_size, kvstores, notes)``."""
    devices, note = resolve_devices(config.num_gpus, config.cpu_devices)
    check_split(devices, config.split)
    check_dtype(config.dtype, devices)
    images = DATASETS[config.dataset]['train']
    batch_size, cut = fit_batch(config.model, devices, min(config.num_train or images, images),
                                config.batch_size, sync_bn=config.sync_bn, memory=False)
    if config.sync_bn:
        check_training(config.model, devices, batch_size, config.split, config.book_literal)
    kvstores = list(config.kvstore)
    for kvstore in [k for k in kvstores if k not in DIST_KVSTORES]:
        check_kvstore(kvstore, devices)
    if config.profile is not None:  # its steps, devices MXNet's profiler cannot tell apart,
        # a default trace file that is not one of ours (loaded with --profile)
        # pylint: disable-next=import-outside-toplevel
        from ..observe.profile import check_default, check_devices, parse_steps
        parse_steps(config.profile)
        check_devices(devices)
        if config.profile_file is None:
            check_default(config.profile_path)
    # every output can be written, each its own (``targets.check_outputs``); a chart's format
    # must be one its extension names
    check_paths(files=[('--plot', config.plot), ('--json', config.json),
                       ('--metrics', config.metrics), ('--profile-file', config.profile_path)],
                directories=[('--report', config.report), ('--tensorboard', config.tensorboard)],
                checkpoint_dir=config.checkpoint_dir,
                inputs=[] if config.synthetic else input_files(config.dataset, config.data_dir))
    if config.plot is not None:
        check_chart_path(config.plot, '--plot')
    # Last: what the machine has (a run too large here) after what the command line asks.
    check_batch_memory(config.model, devices, batch_size, config.sync_bn)
    return devices, batch_size, kvstores, [note, cut]


def run(config, out=None, stop=None, program='gluon-multigpu-{}'.format, resume=None):
    """Check the input, train once per kvstore, report; return the list of TrainResult.

    ``stop`` (a ``StopRequest``) is asked after every step. ``program(name)`` is how
    lines name a program (default: its console script, ``gluon-multigpu-NAME``);
    ``resume()`` the command that continues the run (None: none is said).
    """
    out = out or sys.stdout
    devices, batch_size, kvstores, notes = check_run(config)
    metrics = None if config.tensorboard is None and config.metrics is None else Metrics(
        tensorboard=config.tensorboard, path=config.metrics, every=config.log_every)
    worker = join_parameter_server(kvstores, stop, program)  # until every worker has joined
    if metrics is not None:
        metrics.rank = worker.rank  # only the first worker writes
    _PHASE['rank'] = worker.rank
    if worker.rank:
        out = RankPrefixed(out, worker.rank)
    lr = config.lr or RECIPES[config.model].lr(batch_size * worker.count)
    checkpoint = for_run(config.checkpoint_dir, config.recorded(batch_size, lr, worker.count),
                         config.resume, kvstores, worker.rank)
    guard = stall_guard(config, devices, resume)
    stall = stall_hook(config.stall_timeout,
                       line=functools.partial(stall_message, config, resume=resume))
    # Under the launcher: report the steps, stop on the step it names (the same for all workers).
    control = Control.from_environment(
        stop=stop, on_stop=lambda step: say_quietly(launcher_stops(step)))
    # Copies of the parameters only to compare several kvstores (45 MB an epoch for ResNet-18).
    tracker = ParamTracker(compare=len(kvstores) > 1)
    with checkpoint or contextlib.nullcontext(), tracker, guard or contextlib.nullcontext():
        # Loaded before any training, so that bad data stops the run at once.
        train_iter, test_iter, data_note = make_loaders(config, batch_size, len(devices), worker)
        if checkpoint is not None:
            checkpoint.check_directory(config.num_epochs, len(train_iter))
        profile = profile_hook(config, out, worker, config.num_epochs * len(train_iter))
        for message in filter(None, (*notes, data_note)):
            print(GluonMultiGPUError(message).describe(flag), file=out)
        print(f'training {config.model} on {config.dataset}: {train_iter.num_samples} train / '
              f'{len(test_iter.labels) if test_iter else 0} test images, batch {batch_size} '
              f'({per_device(config.split, batch_size, len(devices))}){worker.describe(batch_size)}, '
              f'lr {lr:g}{updates_line(config)}, {config.num_epochs} epoch(s), devices {devices}',
              file=out, flush=True)
        if config.resume:
            print_resumed(checkpoint, config.num_epochs, out)
        record = None if worker.rank else dict(
            config.as_dict(), batch_size=batch_size, lr=lr, devices=[str(d) for d in devices],
            num_train=train_iter.num_samples, num_test=len(test_iter.labels), workers=worker.count)
        hooks = [h for h in (checkpoint, stop, control, guard, metrics, stall, profile)
                 if h is not None]
        runs = functools.partial(KvstoreRun, config, worker, devices, lr, train_iter, test_iter,
                                 out, tracker, hooks)
        comparison = Comparison(config, record, tracker, out, stop)
        # several kvstores take turns, epoch after epoch; a single one trains directly
        return (comparison.run(runs, quiet=bool(worker.rank)) if len(kvstores) > 1 else
                _train_one(comparison, kvstores[0], runs, config.num_epochs, worker))


def _train_one(comparison, kvstore, runs, num_epochs, worker):
    """Train the one kvstore directly (no turns to take) and report as a comparison does."""
    one = comparison.runs[kvstore] = runs(kvstore, None)
    if one.training is None:  # the text's own loop (--book-literal)
        one.train(num_epochs)
    else:  # the section's loop, called directly
        one.result = one.training.fit(num_epochs)
        one.result.workers = worker.count
    return comparison.finish(quiet=bool(worker.rank))


def make_loaders(config, batch_size, num_devices, worker):
    """Load the data set (or make random data of its shape): ``(train_iter, test_iter, note)``.

    A worker of a parameter server trains on its share of every global batch
    and, unless it is the first, does not evaluate (``test_iter`` None).
    """
    equal = bool(config.sync_bn)  # equal shards in every batch, the last one too
    make = synthetic_data if config.synthetic else load_data
    more = {} if config.synthetic else {'root': config.data_dir, 'download': config.download}
    train_iter, test_iter = make(config.dataset, batch_size, num_train=config.num_train,
                                 num_test=config.num_test, seed=config.seed, num_devices=num_devices,
                                 equal_shards=equal, **more)
    train_iter, test_iter = worker.shard(train_iter, test_iter, config.seed)
    dropped = len(train_iter.labels) - train_iter.num_samples * worker.count
    why = (f'they make no whole global batch of {batch_size} x {worker.count} workers'
           if worker.count > 1 else f'with `sync_bn` every batch must divide evenly among the '
           f'{num_devices} devices' if equal else f'fewer than the {num_devices} devices')
    last = '' if worker.count > 1 else 'the last '
    return train_iter, test_iter, (f'dropping {last}{dropped} training sample(s) of each epoch: '
                                   f'{why}' if dropped else None)


def profile_hook(config, out, worker, total):
    """The ``Profile`` hook of --profile (None without it, and on a parameter server's workers
    but the first), its range checked against the run's ``total`` steps."""
    if config.profile is None or worker.rank:
        return None
    from ..observe.profile import Profile  # pylint: disable=import-outside-toplevel  (with --profile)
    profile = Profile(config.profile, config.profile_file, out=out)
    profile.check_total(total, total // config.num_epochs)
    return profile


def updates_line(config):
    """`` (cosine after 100 warm-up updates), an update every 4 batches, ...``: what
    the first line says of updates other than the book's."""
    warm = f' after {config.warmup_steps} warm-up updates' if config.warmup_steps else ''
    clip = config.clip_grad_norm
    return ''.join(part for part in (
        (config.lr_schedule != 'constant' or warm) and f' ({config.lr_schedule}{warm})',
        config.accumulate > 1 and f', an update every {config.accumulate} batches',
        clip is not None and f', gradient norm clipped at {clip:g}') if part)


def print_resumed(checkpoint, num_epochs, out):
    """Say what a resumed run continues from, with the epochs it had done."""
    state = checkpoint.load() if checkpoint.exists() else None  # (--resume needs a directory)
    if state is None:
        print(f'no checkpoint in {checkpoint.directory} yet: starting at epoch 1', file=out)
        return
    print(f'resuming from the checkpoint {checkpoint.describe()}', file=out)
    for record in state.history:
        print(epoch_line(record, num_epochs), file=out)


def stall_guard(config, devices, resume=None):
    """A ``StallGuard`` for synchronised BatchNorm on CPU contexts (None elsewhere).

    It ends the process (status 3) with one line when no step finished for a
    long time: MXNet's barrier has been seen to wait forever there.
    """
    if not (config.sync_bn and devices[0].device_type == 'cpu' and config.max_in_flight):
        return None

    def on_stall(waited):
        print(f'error: no training step finished for {waited:.0f} s: synchronised BatchNorm on '
              'CPU contexts can wait forever in MXNet 1.9.1 (docs/exercises.md); run without '
              f'--sync-bn or on GPUs{kept_checkpoint(config, resume)}', file=sys.stderr, flush=True)
        os._exit(STALLED)  # pylint: disable=protected-access  (the engine cannot be unblocked)
    return StallGuard(on_stall)


def kept_checkpoint(config, resume=None):
    """What a run ended at once says of its checkpoint: kept, and how to resume (``resume()``,
    the command; '' if no checkpoint)."""
    if config.checkpoint_dir and os.path.isfile(os.path.join(config.checkpoint_dir,
                                                             'manifest.json')):
        return '; the last checkpoint is kept' + (f', resume with: {resume()}' if resume else '')
    return ''


def stall_message(config, waited, longest, resume=None):
    """The line of a run whose steps stalled for ``waited`` seconds, ``longest`` the longest
    time between two steps before (--stall-timeout)."""
    line = GluonMultiGPUError(stall_line(config.stall_timeout, waited, longest)).describe(flag)
    return f'error: {line}{kept_checkpoint(config, resume)}'


def per_device(split, batch_size, num_devices):
    """How a batch is shared, for the first line: ``64 per device``, ``32 + 96 by --split 1,3``
    or ``64 per device at first, then --split auto``."""
    if isinstance(split, list):
        return (' + '.join(str(n) for n in split_sizes(batch_size, split)) + ' by --split '
                + ','.join(f'{w:g}' for w in split))
    return even_shares(batch_size, num_devices) + (f' at first, then --split {split}' if split
                                                   else '')


#: Whether the process waits to join the parameter server (a signal then ends it, not a step),
#: and its rank once joined (0 without a parameter server).
_PHASE = {'joining': False, 'rank': 0}


def joining():
    """Whether the process waits to join the parameter server now."""
    return _PHASE['joining']


def worker_rank():
    """This process's rank among the parameter server's workers (0: the first, or alone)."""
    return _PHASE['rank']


def join_parameter_server(kvstores, stop=None, program='gluon-multigpu-{}'.format):
    """Join the parameter server if a dist kvstore was asked for; return this ``Worker``.

    A signal (``stop``) raises ``Interrupted`` (``joining``); the join's time-out,
    ``distributed.JoinError``. ``program``: as ``run``'s.
    """
    dist = next((k for k in kvstores if k in DIST_KVSTORES), None)
    _PHASE['joining'] = dist is not None
    try:
        return join(kvstores, start=f'{program("launch")} -n WORKERS -s SERVERS -- '
                    f'{program("train")} --kvstore {dist} ...', stop=stop)
    finally:
        _PHASE['joining'] = False


class RankPrefixed:
    """A text stream that puts ``rank R: `` before every line (the workers after the first)."""

    def __init__(self, stream, rank):
        self.stream, self.prefix, self._start = stream, f'rank {rank}: ', True

    def write(self, text):
        for piece in text.splitlines(keepends=True):
            self.stream.write(self.prefix + piece if self._start else piece)
            self._start = piece.endswith('\n')
        return len(text)

    def flush(self):
        self.stream.flush()

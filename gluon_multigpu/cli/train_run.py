"""What one train command does once parsed: the checks, the data, a training per kvstore.

The command line's part only: every check and setting of a run is the
library's (``recipes``, ``model.fit_batch``, ``checks.check_loop_options``,
``sync_bn.check_training``, ``distributed.join``, ``checkpoint.for_run``,
``targets.check_outputs``); this module chooses the hooks the flags ask for
and prints the lines. It loads MXNet: a program imports it once the engine
is set (``console.prepare_engine``).
"""
import contextlib
import os
import sys

from . import messages
from .arguments import FLAGS
from .comparison import Comparison
from .kvstore_run import RunMaker
from .console import program, resume_command, say_quietly
from ..core.checks import check_loop_options
from ..core.data import DATASETS, load_data, synthetic_data
from ..core.devices import even_shares, resolve_devices, split_sizes
from ..core.kvstores import DIST_KVSTORES, check_kvstore
from ..core.metrics import Metrics
from ..core.model import check_batch_memory, fit_batch
from ..core.updates import check_options as check_update_options
from ..core.recipes import RECIPES
from ..core.results import epoch_line
from ..core.stall import STALLED, stall_hook, stall_line
from ..errors import GluonMultiGPUError
from ..features.distributed import Control, join
from ..features.precision import check_dtype
from ..features.sync_bn import check_options as check_sync_bn_options, check_training
from ..checkpoints.checkpoint import for_run, run_config
from ..run.stopping import StallGuard, StopRequest
from ..outputs.targets import check_outputs as check_paths, input_files
from ..study.charts import check_chart_path
from ..study.compare import ParamTracker

__all__ = ['run', 'joining', 'worker_rank', 'per_device', 'RankPrefixed']


def check_run(args):
    """The checks before any work; return ``(devices, batch_size, kvstores, notes)``."""
    devices, note = resolve_devices(args.num_gpus, args.cpu_devices)
    # Options that cannot go together first: what they say holds whatever the machine has.
    check_loop_options(devices, args.split, args.dtype, args.book_literal)
    check_dtype(args.dtype, devices)
    check_stall_options(args)
    check_update_options(args.kvstore, args.clip_grad_norm, args.book_literal,
                         changed=updates_of(args) is not None)
    if args.sync_bn:
        check_sync_bn_options(args.model, args.split, args.book_literal)
    images = DATASETS[args.dataset]['train']
    batch_size, cut = fit_batch(args.model, devices, min(args.num_train or images, images),
                                args.batch_size, sync_bn=args.sync_bn, memory=False)
    if args.sync_bn:
        check_training(args.model, devices, batch_size, args.split, args.book_literal)
    kvstores = list(dict.fromkeys(args.kvstore))
    for kvstore in kvstores:
        if kvstore not in DIST_KVSTORES:
            check_kvstore(kvstore, devices)
    check_profile(args, devices, kvstores)
    check_outputs(args)
    # Last: what the machine has (a run too large here) after what the command line asks.
    check_batch_memory(args.model, devices, batch_size, args.sync_bn)
    return devices, batch_size, kvstores, [note, cut]


def check_outputs(args):
    """Raise GluonMultiGPUError unless every output path can be written, each its own (see
    ``targets.check_outputs``); a chart's format must be one its extension names."""
    check_paths(files=[('--plot', args.plot), ('--json', args.json),
                       ('--metrics', getattr(args, 'metrics', None)),
                       ('--profile-file', profile_file(args))],
                directories=[('--report', args.report),
                             ('--tensorboard', getattr(args, 'tensorboard', None))],
                checkpoint_dir=args.checkpoint_dir,
                inputs=[] if args.synthetic else input_files(args.dataset, args.data_dir))
    if args.plot is not None:
        check_chart_path(args.plot, '--plot')


def run(args, out=None, stop=None):
    """Check the input, train once per kvstore, report; return the list of TrainResult.

    ``stop`` (a ``StopRequest``) is asked after every step.
    """
    out = out or sys.stdout
    devices, batch_size, kvstores, notes = check_run(args)
    metrics = metrics_hook(args, kvstores)
    worker = join_parameter_server(kvstores, stop)  # blocks until every worker has joined
    if metrics is not None:
        metrics.rank = worker.rank  # only the first worker writes
    _PHASE['rank'] = worker.rank
    if worker.rank:
        out = RankPrefixed(out, worker.rank)
    lr = args.lr or RECIPES[args.model].lr(batch_size * worker.count)
    checkpoint = make_checkpointer(args, batch_size, lr, kvstores, worker)
    guard = stall_guard(args, devices)
    stall = stall_hook(args.stall_timeout, line=lambda waited: stall_message(args, waited))
    # Under the launcher: report the steps, stop on the step it names (the same for all workers).
    control = Control.from_environment(
        stop=stop, on_stop=lambda step: say_quietly(messages.launcher_stops(step)))
    # Copies of the parameters only to compare several kvstores (45 MB an epoch for ResNet-18).
    tracker = ParamTracker(compare=len(kvstores) > 1)
    with checkpoint or contextlib.nullcontext(), tracker, guard or contextlib.nullcontext():
        # Loaded before any training, so that bad data stops the run at once.
        train_iter, test_iter, data_note = make_loaders(args, batch_size, len(devices), worker)
        if checkpoint is not None:
            checkpoint.check_directory(args.num_epochs, len(train_iter))
        profile = profile_hook(args, out, worker, args.num_epochs * len(train_iter))
        for message in (*notes, data_note):
            if message:
                print(GluonMultiGPUError(message).describe(FLAGS), file=out)
        print(f'training {args.model} on {args.dataset}: {train_iter.num_samples} train / '
              f'{len(test_iter.labels) if test_iter else 0} test images, batch {batch_size} '
              f'({per_device(args.split, batch_size, len(devices))}){worker.describe(batch_size)}, '
              f'lr {lr:g}{updates_line(args)}, {args.num_epochs} epoch(s), devices {devices}',
              file=out, flush=True)
        if args.resume:
            print_resumed(checkpoint, args.num_epochs, out)
        config = None if worker.rank else dict(
            vars(args), batch_size=batch_size, lr=lr, kvstore=kvstores,
            devices=[str(d) for d in devices], num_train=train_iter.num_samples,
            num_test=len(test_iter.labels), workers=worker.count)
        hooks = [h for h in (checkpoint, stop, control, guard, metrics, stall, profile)
                 if h is not None]
        runs = RunMaker(args, worker, devices, lr, train_iter, test_iter, out, tracker, hooks)
        comparison = Comparison(args, kvstores, config, tracker, out, stop)
        if len(kvstores) > 1:  # the kvstores take turns, epoch after epoch
            return comparison.run(runs, quiet=bool(worker.rank))
        one = comparison.runs[kvstores[0]] = runs(kvstores[0])
        if one.training is None:  # the text's own loop (--book-literal)
            one.train(args.num_epochs)
        else:  # the section's loop, called directly
            one.result = one.training.fit(args.num_epochs)
            one.result.workers = worker.count
        return comparison.finish(quiet=bool(worker.rank))


def make_loaders(args, batch_size, num_devices, worker):
    """Load the data set (or make random data of its shape): ``(train_iter, test_iter, note)``.

    A worker of a parameter server trains on its share of every global batch
    and, unless it is the first, does not evaluate (``test_iter`` None).
    """
    equal = bool(args.sync_bn)  # equal shards in every batch, the last one too
    make = synthetic_data if args.synthetic else load_data
    more = {} if args.synthetic else {'root': args.data_dir, 'download': args.download}
    train_iter, test_iter = make(args.dataset, batch_size, num_train=args.num_train,
                                 num_test=args.num_test, seed=args.seed, num_devices=num_devices,
                                 equal_shards=equal, **more)
    train_iter, test_iter = worker.shard(train_iter, test_iter, args.seed)
    dropped = len(train_iter.labels) - train_iter.num_samples * worker.count
    note = None
    if dropped and worker.count > 1:
        note = (f'dropping {dropped} training sample(s) of each epoch: they make no whole global '
                f'batch of {batch_size} x {worker.count} workers')
    elif dropped and equal:
        note = (f'dropping the last {dropped} training sample(s) of each epoch: with `sync_bn` '
                f'every batch must divide evenly among the {num_devices} devices')
    elif dropped:
        note = (f'dropping the last {dropped} training sample(s) of each epoch: '
                f'fewer than the {num_devices} devices')
    return train_iter, test_iter, note


def metrics_hook(args, kvstores):
    """The ``Metrics`` hook of --tensorboard and --metrics (None without them), checked."""
    if getattr(args, 'tensorboard', None) is None and getattr(args, 'metrics', None) is None:
        return None
    if len(kvstores) > 1:
        raise GluonMultiGPUError('`tensorboard` and `metrics` follow one run; give a single '
                                 '`kvstore`')
    if args.book_literal:
        raise GluonMultiGPUError("`book_literal` runs the text's loop, which no hook follows; "
                                 'drop `tensorboard` and `metrics` or `book_literal`')
    return Metrics(tensorboard=args.tensorboard, path=args.metrics, every=args.log_every)


def check_profile(args, devices, kvstores):
    """Raise GluonMultiGPUError for a --profile this run cannot take: its steps, several
    kvstores, the text's loop, devices MXNet's profiler cannot tell apart."""
    if getattr(args, 'profile', None) is None:
        if getattr(args, 'profile_file', None) is not None:
            raise GluonMultiGPUError('`profile_file` needs `profile` START:STOP, the steps to '
                                     'profile')
        return
    from ..core.profile import check_devices, parse_steps  # pylint: disable=import-outside-toplevel
    parse_steps(args.profile)
    if len(kvstores) > 1 or args.book_literal:
        raise GluonMultiGPUError('`profile` follows one run of the section\'s loop: give one '
                                 '`kvstore`, without `book_literal`')
    check_devices(devices)


def profile_file(args):
    """Where --profile writes its trace (None without --profile)."""
    if getattr(args, 'profile', None) is None:
        return None
    return args.profile_file or 'profile.json'


def profile_hook(args, out, worker, total):
    """The ``Profile`` hook of --profile (None without it, and on a parameter server's workers
    but the first), its range checked against the run's ``total`` steps."""
    if args.profile is None or worker.rank:
        return None
    from ..core.profile import Profile  # pylint: disable=import-outside-toplevel  (with --profile)
    profile = Profile(args.profile, profile_file(args), out=out)
    profile.check_total(total, total // args.num_epochs)
    return profile


def make_checkpointer(args, batch_size, lr, kvstores, worker):
    """The checkpoint hook of ``--checkpoint-dir`` (None without it), checked for this run."""
    config = run_config(args.model, args.dataset, batch_size, lr, args.seed, args.num_train,
                        args.num_test, book_literal=args.book_literal, workers=worker.count,
                        dtype=args.dtype, sync_bn=args.sync_bn, updates=updates_of(args))
    return for_run(args.checkpoint_dir, config, args.resume, kvstores, worker.rank)


def updates_of(args):
    """What a run's updates do other than the book's (None: nothing), as its checkpoint
    records it: a schedule's length in epochs included."""
    updates = {key: value for key, value, book in (
        ('accumulate', args.accumulate, 1), ('clip_grad_norm', args.clip_grad_norm, None),
        ('lr_schedule', args.lr_schedule, 'constant'), ('warmup_steps', args.warmup_steps, 0))
        if value != book}
    if args.lr_schedule != 'constant':
        updates['schedule_epochs'] = args.num_epochs  # its rates follow the run's length
    return updates or None


def updates_line(args):
    """`` (cosine after 100 warm-up updates), an update every 4 batches, ...``: what
    the first line says of updates other than the book's."""
    parts = []
    if args.lr_schedule != 'constant' or args.warmup_steps:
        warm = f' after {args.warmup_steps} warm-up updates' if args.warmup_steps else ''
        parts.append(f' ({args.lr_schedule}{warm})')
    if args.accumulate > 1:
        parts.append(f', an update every {args.accumulate} batches')
    if args.clip_grad_norm is not None:
        parts.append(f', gradient norm clipped at {args.clip_grad_norm:g}')
    return ''.join(parts)


def print_resumed(checkpoint, num_epochs, out):
    """Say what a resumed run continues from, with the epochs it had done."""
    state = checkpoint.load() if checkpoint is not None and checkpoint.exists() else None
    if state is None:
        if checkpoint is not None:
            print(f'no checkpoint in {checkpoint.directory} yet: starting at epoch 1', file=out)
        return
    print(f'resuming from the checkpoint {checkpoint.describe()}', file=out)
    for record in state.history:
        print(epoch_line(record, num_epochs), file=out)


def stall_guard(args, devices):
    """A ``StallGuard`` for synchronised BatchNorm on CPU contexts (None elsewhere).

    It ends the process (status 3) with one line when no step finished for a
    long time: MXNet's barrier has been seen to wait forever there.
    """
    if not (args.sync_bn and devices[0].device_type == 'cpu' and args.max_in_flight):
        return None

    def on_stall(waited):
        print(f'error: no training step finished for {waited:.0f} s: synchronised BatchNorm on '
              'CPU contexts can wait forever in MXNet 1.9.1 (docs/exercises.md); run without '
              f'--sync-bn or on GPUs{kept_checkpoint(args)}', file=sys.stderr, flush=True)
        os._exit(STALLED)  # pylint: disable=protected-access  (the engine cannot be unblocked)
    return StallGuard(on_stall)


def kept_checkpoint(args):
    """What a run ended at once says of its checkpoint: kept, and how to resume ('' if none)."""
    if args.checkpoint_dir and os.path.isfile(os.path.join(args.checkpoint_dir, 'manifest.json')):
        return f'; the last checkpoint is kept, resume with: {resume_command("train")}'
    return ''


def check_stall_options(args):
    """Refuse --stall-timeout where no step can be watched: the text's loop, unbounded steps."""
    if args.stall_timeout and args.book_literal:
        raise GluonMultiGPUError("`stall_timeout` watches the steps of the section's loop, and "
                                 "`book_literal` runs the text's loop, which no hook follows; "
                                 'drop one of them')
    if args.stall_timeout and not args.max_in_flight:
        raise GluonMultiGPUError('`stall_timeout` watches the time between steps, and with '
                                 '`max_in_flight` 0 a whole epoch is queued at once and waited '
                                 'for at its end; give `max_in_flight` 1 or more')


def stall_message(args, waited):
    """The line of a run whose steps stalled for ``waited`` seconds (--stall-timeout)."""
    line = GluonMultiGPUError(stall_line(args.stall_timeout, waited)).describe(FLAGS)
    return f'error: {line}{kept_checkpoint(args)}'


def per_device(split, batch_size, num_devices):
    """How a batch is shared, for the first line: ``64 per device``, ``32 + 96 by --split 1,3``
    or ``64 per device at first, then --split auto``."""
    if isinstance(split, list):
        sizes = split_sizes(batch_size, split)
        return (' + '.join(str(n) for n in sizes) + ' by --split '
                + ','.join(f'{w:g}' for w in split))
    even = even_shares(batch_size, num_devices)
    return even + (f' at first, then --split {split}' if split else '')


#: Whether the process waits to join the parameter server (a signal then ends it, not a step),
#: and its rank once joined (0 without a parameter server).
_PHASE = {'joining': False, 'rank': 0}


def joining():
    """Whether the process waits to join the parameter server now."""
    return _PHASE['joining']


def worker_rank():
    """This process's rank among the parameter server's workers (0: the first, or alone)."""
    return _PHASE['rank']


def join_parameter_server(kvstores, stop=None):
    """Join the parameter server if a dist kvstore was asked for; return this ``Worker``.

    A signal (``stop``) raises ``Interrupted`` (``joining``); the join's time-out,
    ``distributed.JoinError``.
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
            if self._start:
                self.stream.write(self.prefix)
            self.stream.write(piece)
            self._start = piece.endswith('\n')
        return len(text)

    def flush(self):
        self.stream.flush()

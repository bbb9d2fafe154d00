"""Train the book's ResNet-18 (or the lab's simple CNN) data-parallel on several devices.

The loop of d2l 13.6 "Concise Implementation for Multiple GPUs": parameters on
every device, each batch split across them, gradients summed by the kvstore.
Without GPUs, ``--cpu-devices N`` runs the same code on N CPU contexts.

The command line only: every check and setting of a run is the library's
(``recipes``, ``model.fit_batch``, ``sync_bn.check_training``,
``distributed.join``, ``checkpoint.for_run``, ``files.check_outputs``).
"""
import contextlib
import os
import signal
import sys

import gluon_multigpu as gm  # loads MXNet only when a name needs it: after the engine settings
from . import common
from .common import (FLAGS, batch_size, error_line, int_in, non_negative_float, num_epochs,
                     path_of, positive_float, say_quietly, script_parser)
from ..core.recipes import MAX_IN_FLIGHT, RECIPES

EPILOG = """\
defaults per model (--batch-size, --lr):
{defaults}

examples:
  %(prog)s --num-gpus 2                       the book's 2-GPU run (batch 512, lr 0.2)
  %(prog)s --cpu-devices 2 --model simple-cnn --num-epochs 2 --data-dir DIR
  %(prog)s --cpu-devices 2 --kvstore local device --json runs.json --plot acc.png
  %(prog)s --num-gpus 2 --kvstore local device nccl none --report kvstores/

Bad input (a device that does not exist, a batch that cannot be split, missing
or corrupt data, a non-positive number, an output directory that does not
exist or takes no new files, a checkpoint of another run) stops before training with one line on
stderr and exit status 2; a loss that becomes NaN stops with status 2 and
keeps the last good checkpoint. A batch larger than the training set is cut
to it; on CPU contexts a batch whose estimated memory (about 16 MB per sample
for resnet18, 0.32 MB for simple-cnn, plus the process) exceeds the memory
available is refused, naming the largest that fits. Ctrl-C (SIGINT), SIGTERM
or SIGHUP (the terminal closed) stops after the current step (during an
evaluation: at that epoch's end), writes a checkpoint with --checkpoint-dir,
says how to resume, and exits with 130, 143 or 129; a second Ctrl-C (half a
second or more after the first: a wrapper such as timeout repeats one Ctrl-C)
stops at once. A signal after the last step lets the run finish, says so, and
exits with the same status. Several kvstores are compared one after another:
the first measured steps give the time the whole comparison takes, each
progress line the time left for it; the outputs are written as each kvstore
finishes, marked partial until all have, and a stop keeps the finished
kvstores' results (printed, and written marked partial).
""".format(defaults='\n'.join(f'  {name:<12} {r.describe}' for name, r in RECIPES.items()))


def build_parser():
    """Return the argument parser of this script."""
    p = script_parser(__doc__, EPILOG,
                      'train on gpu(0)..gpu(N-1) (default: all GPUs, or the CPU if none)',
                      'train on N CPU contexts cpu(0)..cpu(N-1) instead of GPUs')
    p.add_argument('--kvstore', nargs='+', choices=gm.KVSTORES + gm.kvstores.DIST_KVSTORES,
                   default=['device'],
                   metavar='KV', help='gradient synchronisation: local (sum on the CPU), device '
                   '(sum on the devices), nccl (NCCL between GPUs; needs an MXNet build with '
                   'NCCL) or none (no kvstore: the Trainer sums the gradients itself); several '
                   'run in turn on the same data and initial weights and end with a '
                   'side-by-side table, including how far their parameters drift apart; '
                   'dist_sync, dist_device_sync or dist_async: a worker of MXNet\'s parameter '
                   'server, started by scripts/launch.py, --batch-size then per worker '
                   '(default: device)')
    p.add_argument('--batch-size', type=batch_size, metavar='N',
                   help='total batch size over all devices (default: per model, see below); '
                   'one larger than the training set is cut to it, and on CPU contexts one whose '
                   'estimated memory exceeds what is available is refused (see below)')
    p.add_argument('--lr', type=positive_float, metavar='LR',
                   help='SGD learning rate (default: per model, see below)')
    p.add_argument('--num-epochs', type=num_epochs, default=10, metavar='N',
                   help='passes over the training set (default: 10)')
    common.add_run_flags(p, gm.MODELS, gm.DATASETS, 'the same for every kvstore')
    p.add_argument('--download', action='store_true',
                   help="download missing files from MXNet's mirror (needs internet)")
    p.add_argument('--plot', metavar='PATH', type=path_of('a file name'),
                   help='write the test-accuracy curve as a chart, PNG, SVG or PDF by the '
                   'extension of PATH')
    p.add_argument('--json', metavar='PATH', type=path_of('a file name'),
                   help='write every figure of the run(s) as JSON')
    p.add_argument('--report', metavar='DIR', type=path_of('a directory'),
                   help='write a Markdown report comparing the kvstores (report.md, with '
                   'accuracy.png, seconds.png and runs.json) into DIR, created if missing')
    p.add_argument('--checkpoint-dir', metavar='DIR', type=path_of('a directory'),
                   help='save the run after every epoch (parameters, optimizer state, data '
                   'order, history) into DIR, created if missing; Ctrl-C, SIGTERM or SIGHUP '
                   'also saves before stopping. Writes are atomic: a crash keeps the last '
                   'complete one')
    p.add_argument('--resume', action='store_true',
                   help='continue from the checkpoint in --checkpoint-dir (on any number of '
                   'devices); without one there, start at epoch 1')
    p.add_argument('--book-literal', action='store_true',
                   help="run the text's loop (nn.Block residuals, no hybridization, no "
                   'training loss or accuracy) instead of the fast path')
    p.add_argument('--max-in-flight', type=int_in(0, 1000), default=MAX_IN_FLIGHT, metavar='K',
                   help='steps MXNet may run behind Python: after queuing a step, wait for the '
                   'one K steps back, so Ctrl-C and progress act within a step; 0 = no bound, '
                   f"the book's loop (default: {MAX_IN_FLIGHT})")
    p.add_argument('--split', type=common.split_weights, default=None,
                   metavar='even|auto|W1,W2,...',
                   help='how each batch is shared among the devices, for devices of different '
                   'speed: even (the book); auto, shares measured from each device\'s step time '
                   'during the first steps and re-balanced when the times drift (a line after '
                   'each epoch gives the shares and each device\'s idle time); or one relative '
                   'weight per device, e.g. 1,3 gives the second device three times the samples '
                   'of the first (default: even)')
    p.add_argument('--sync-bn', action='store_true',
                   help='ResNet-18 with synchronised BatchNorm: the mean and variance of each '
                   'BatchNorm layer over all devices\' shards, as one device with the whole batch '
                   'would compute them, and the same running statistics on every device (needs '
                   'the even split and a batch size divisible by the devices; the samples that '
                   'would make the last batch uneven are dropped; MXNet\'s SyncBatchNorm, '
                   'slower per step)')
    p.add_argument('--dtype', choices=gm.precision.DTYPES, default='float32',
                   help='compute type: float32 (the book); float16 on GPUs, with float32 master '
                   'weights and dynamic loss scaling (CPU contexts have no float16 matrix '
                   'multiply in MXNet 1.9.1); bfloat16 is explained in docs/exercises.md '
                   '(default: float32)')
    p.add_argument('--synthetic', action='store_true',
                   help='random images and labels of the data set\'s shape instead of the '
                   'files, for speed tests (accuracy means nothing then)')
    p.add_argument('--progress-interval', type=non_negative_float, default=10.0,
                   metavar='SECONDS',
                   help='seconds between progress lines within an epoch on stderr; '
                   '0 turns them off (default: 10)')
    return p


def parse_args(argv=None):
    """Parse the command line (``sys.argv[1:]`` when ``argv`` is None)."""
    return build_parser().parse_args(argv)


def make_loaders(args, batch_size, num_devices, worker):
    """Load the data set (or make random data of its shape); return ``(train_iter, test_iter, note)``.

    A worker of a parameter server trains on its share of every global batch
    and, unless it is the first, does not evaluate (``test_iter`` None).
    """
    equal = bool(args.sync_bn)  # equal shards in every batch, the last one too
    if args.synthetic:
        train_iter, test_iter = gm.data.synthetic_data(
            args.dataset, batch_size, num_train=args.num_train, num_test=args.num_test,
            seed=args.seed, num_devices=num_devices, equal_shards=equal)
    else:
        train_iter, test_iter = gm.load_data(
            args.dataset, batch_size, root=args.data_dir, download=args.download,
            num_train=args.num_train, num_test=args.num_test, seed=args.seed,
            num_devices=num_devices, equal_shards=equal)
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


def train_one(args, kvstore, devices, lr, train_iter, test_iter, out, tracker, hooks=(),
              worker=None, schedule=None):
    """Train a fresh model (or resume one) with one kvstore; print each epoch; return the result.

    After each epoch ``tracker`` records the parameters, for the comparison;
    ``schedule`` (a ``progress.Schedule``) holds the kvstores compared, for the
    progress lines' time left.
    """
    train_iter.epoch = 0  # every kvstore sees the same sequence of batches
    classes = gm.DATASETS[args.dataset]['classes']
    if args.book_literal and args.model == 'resnet18':
        net = gm.book.resnet18(classes)  # the text's: nn.Block residuals
    else:
        net = gm.get_model(args.model, classes,
                           gm.sync_bn.sync_batch_norm(len(devices)) if args.sync_bn else None)

    split = gm.balance.make_split(args.split)

    def on_epoch(record):
        line = gm.epoch_line(record, args.num_epochs)
        if worker is not None and worker.count > 1:  # the workers must agree: show it
            line += f', parameters {gm.compare.fingerprint(net)}'
        print(line, file=out, flush=True)
        if isinstance(split, gm.balance.TimedSplit):
            print(f'  {split.summary()}', file=out, flush=True)
            split.reset_stats()
        tracker.record(gm.kvstores.kvstore_name(kvstore), record.epoch, net)

    settings = dict(num_epochs=args.num_epochs, lr=lr, kvstore=kvstore, seed=args.seed,
                    initializer=gm.default_initializer(args.model), on_epoch=on_epoch)
    if args.book_literal:  # the text's loop, asking the stop request between steps
        stop = next((h for h in hooks if isinstance(h, gm.StopRequest)), None)
        return gm.train_book(net, train_iter, test_iter, devices,
                             batch_size=train_iter.batch_size, stop=stop, **settings)
    label = (f'kvstore {gm.kvstores.kvstore_name(kvstore)} on {len(devices)} '
             f'{devices[0].device_type.upper()}') + \
        ('s' if len(devices) > 1 else '')
    progress = gm.Progress(say, args.progress_interval, label, args.num_epochs,
                           advice=faster_advice(args, devices), schedule=schedule)
    features = [split, gm.precision.make_precision(args.dtype, devices)]
    if worker and worker.count > 1:
        features.append(gm.distributed.StepScale(kvstore, worker.count))
    result = gm.train(net, train_iter, test_iter, devices,
                      hooks=[f for f in features if f is not None] + [*hooks, progress],
                      max_in_flight=args.max_in_flight, **settings)
    result.workers = worker.count if worker else 1
    return result


def say(line):
    """Print a progress line on stderr at once (nothing, quietly, if the terminal is gone)."""
    say_quietly(line)


def faster_advice(args, devices):
    """What to try when a run would take long: a smaller model, more contexts, GPUs."""
    options = []
    if args.model != 'simple-cnn':
        options.append('--model simple-cnn trains about 60 times faster')
    if devices[0].device_type == 'cpu' and len(devices) < max(2, common.cores()):
        options.append(f'--cpu-devices {max(2, common.cores())} uses every core')
    if devices[0].device_type == 'cpu':
        options.append("a machine with GPUs takes seconds per epoch (pip install -e '.[cu112]')")
    options.append('--num-train N trains on a subset')
    return 'faster: ' + '; '.join(options)


def make_checkpointer(args, batch_size, lr, kvstores, worker):
    """The checkpoint hook of ``--checkpoint-dir`` (None without it), checked for this run."""
    config = gm.checkpoint.run_config(
        args.model, args.dataset, batch_size, lr, args.seed, args.num_train, args.num_test,
        book_literal=args.book_literal, workers=worker.count, dtype=args.dtype,
        sync_bn=args.sync_bn)
    return gm.checkpoint.for_run(args.checkpoint_dir, config, args.resume, kvstores, worker.rank)


def print_resumed(checkpoint, num_epochs, out):
    """Say what a resumed run continues from, with the epochs it had done."""
    state = checkpoint.load() if checkpoint is not None and checkpoint.exists() else None
    if state is None:
        if checkpoint is not None:
            print(f'no checkpoint in {checkpoint.directory} yet: starting at epoch 1', file=out)
        return
    print(f'resuming from the checkpoint {checkpoint.describe()}', file=out)
    for record in state.history:
        print(gm.epoch_line(record, num_epochs), file=out)


def write_outputs(args, results, config, tracker, pending=(), partial=None):
    """Write the ``--plot``, ``--json`` and ``--report`` files, each atomically; return their paths.

    ``pending``: the kvstores compared whose runs have not finished; ``partial``
    says why (the outputs are then marked partial).
    """
    written = []
    if args.plot:
        devices = ', '.join(results[0].devices)
        gm.charts.accuracy_chart(args.plot, results,
                                 title=f'{args.model} on {args.dataset}, [{devices}]'
                                 + (' (partial)' if partial else ''))
        written.append(args.plot)
    if args.json:
        gm.write_json(args.json, gm.kvstore_report.runs_json(results, tracker, config, partial))
        written.append(args.json)
    if args.report:
        gm.write_kvstore_report(args.report, results, tracker, config,
                                gm.recommend(results, pending=pending), partial)
        written.append(args.report.rstrip('/') + '/')
    return written


def partial_note(pending, finished, why=None):
    """Why the outputs of a comparison are partial: ``why`` it stopped, or that it still runs."""
    if why is None:
        why = (f'written when kvstore {finished[-1]} had finished, while the comparison went on '
               '(a later version replaces this one)')
    return f'{why}; not measured: kvstore {", ".join(pending)}'


def check_outputs(args):
    """Raise GluonMultiGPUError unless every output path can be written, each its own (see
    ``files.check_outputs``); a chart's format must be one its extension names."""
    gm.files.check_outputs(files=[('--plot', args.plot), ('--json', args.json)],
                           directories=[('--report', args.report)],
                           checkpoint_dir=args.checkpoint_dir,
                           inputs=[] if args.synthetic else
                           gm.files.input_files(args.dataset, args.data_dir))
    if args.plot is not None:
        gm.charts.check_chart_path(args.plot, '--plot')


def stall_guard(args, devices):
    """A ``StallGuard`` for synchronised BatchNorm on CPU contexts (None elsewhere).

    It ends the process (status 3) with one line when no step finished for a
    long time: MXNet's barrier has been seen to wait forever there.
    """
    if not (args.sync_bn and devices[0].device_type == 'cpu' and args.max_in_flight):
        return None

    def on_stall(waited):
        kept = ''
        if args.checkpoint_dir and os.path.isfile(os.path.join(args.checkpoint_dir,
                                                               'manifest.json')):
            kept = f'; the last checkpoint is kept, resume with: {resume_command(None)}'
        print(f'error: no training step finished for {waited:.0f} s: synchronised BatchNorm on '
              'CPU contexts can wait forever in MXNet 1.9.1 (docs/exercises.md); run without '
              f'--sync-bn or on GPUs{kept}', file=sys.stderr, flush=True)
        os._exit(3)  # pylint: disable=protected-access  (the engine cannot be unblocked)
    return gm.StallGuard(on_stall)


def per_device(split, batch_size, num_devices):
    """How a batch is shared, for the first line: ``64 per device``, ``32 + 96 by --split 1,3``
    or ``64 per device at first, then --split auto``."""
    if isinstance(split, list):
        sizes = gm.devices.split_sizes(batch_size, split)
        return ' + '.join(str(n) for n in sizes) + ' by --split ' + ','.join(f'{w:g}' for w in split)
    even = f'{batch_size / num_devices:g} per device'
    return even + (f' at first, then --split {split}' if split else '')


def run(args, out=None, stop=None):
    """Check the input, train once per kvstore, report; return the list of TrainResult.

    ``stop`` (a ``StopRequest``) is asked after every step.
    """
    out = out or sys.stdout
    devices, note = gm.devices.resolve_devices(args.num_gpus, args.cpu_devices)
    images = gm.DATASETS[args.dataset]['train']
    batch_size, cut = gm.model.fit_batch(args.model, devices, min(args.num_train or images, images),
                                         args.batch_size, sync_bn=args.sync_bn)
    if isinstance(args.split, list) and len(args.split) != len(devices):
        raise gm.DeviceError(f'--split gives {len(args.split)} weights for {len(devices)} '
                             f'devices; give one weight per device')
    if args.split is not None and args.book_literal:
        raise gm.GluonMultiGPUError("--book-literal runs the text's even split; drop --split")
    if args.dtype != 'float32' and args.book_literal:
        raise gm.GluonMultiGPUError("--book-literal runs the text's float32 loop; drop --dtype")
    gm.precision.check_dtype(args.dtype, devices)
    if args.sync_bn:
        gm.sync_bn.check_training(args.model, devices, batch_size, args.split, args.book_literal)
    kvstores = list(dict.fromkeys(args.kvstore))
    for kvstore in kvstores:
        if kvstore not in gm.kvstores.DIST_KVSTORES:
            gm.kvstores.check_kvstore(kvstore, devices)
    check_outputs(args)
    worker = join_parameter_server(kvstores, stop)  # blocks until every worker has joined
    if worker.rank:
        out = RankPrefixed(out, worker.rank)
    lr = args.lr or RECIPES[args.model].lr(batch_size * worker.count)
    checkpoint = make_checkpointer(args, batch_size, lr, kvstores, worker)
    guard = stall_guard(args, devices)
    # Under the launcher: report the steps, stop on the step it names (the same for all workers).
    control = gm.distributed.Control.from_environment(stop=stop, on_stop=stopped_by_launcher)
    # Copies of the parameters only to compare several kvstores (45 MB an epoch for ResNet-18).
    tracker = gm.ParamTracker(compare=len(kvstores) > 1)
    with checkpoint or contextlib.nullcontext(), tracker, guard or contextlib.nullcontext():
        # Loaded before any training, so that bad data stops the run at once.
        train_iter, test_iter, data_note = make_loaders(args, batch_size, len(devices), worker)
        if checkpoint is not None:
            checkpoint.check_directory(args.num_epochs, len(train_iter))
        for message in (note, cut, data_note):
            if message:
                print(gm.GluonMultiGPUError(message).describe(FLAGS), file=out)
        print(f'training {args.model} on {args.dataset}: {train_iter.num_samples} train / '
              f'{len(test_iter.labels) if test_iter else 0} test images, batch {batch_size} '
              f'({per_device(args.split, batch_size, len(devices))}){worker.describe(batch_size)}, '
              f'lr {lr:g}, {args.num_epochs} epoch(s), devices {devices}', file=out, flush=True)
        if args.resume:
            print_resumed(checkpoint, args.num_epochs, out)
        config = None if worker.rank else dict(
            vars(args), batch_size=batch_size, lr=lr, kvstore=kvstores,
            devices=[str(d) for d in devices], num_train=train_iter.num_samples,
            num_test=len(test_iter.labels), workers=worker.count)
        schedule = gm.progress.Schedule(kvstores, 'kvstore comparison') if len(kvstores) > 1 \
            else None
        results = []
        try:
            for kvstore in kvstores:
                if results and stop is not None and stop():  # a signal in the last run's end
                    raise StoppedBetweenRuns(args.num_epochs, results[-1].kvstore,
                                             kvstores[len(results):])
                if schedule is not None:
                    left = schedule.left()
                    schedule.begin()
                    print(f'-- kvstore {kvstore} ({schedule.position()}'
                          + (f'; the comparison ends in about {gm.progress.duration(left)}'
                             if left is not None else '') + ')', file=out, flush=True)
                result = train_one(args, worker.kvstore or kvstore, devices, lr, train_iter,
                                   test_iter, out, tracker,
                                   [h for h in (checkpoint, stop, control, guard) if h is not None],
                                   worker, schedule)
                if schedule is not None:
                    schedule.end()
                if not worker.rank:
                    print(result.final_line(), file=out, flush=True)
                results.append(result)
                pending = kvstores[len(results):]
                if pending and config is not None:  # what is measured is kept as it comes
                    write_outputs(args, results, config, tracker, pending,
                                  partial_note(pending, kvstores[:len(results)]))
        except gm.Interrupted as e:
            if schedule is not None:
                e.comparison = keep_measured(args, results, config, tracker, kvstores, stop, out)
            raise
        if len(results) > 1:
            print(gm.comparison_table(results, tracker), file=out)
            print(gm.recommend(results), file=out)
        if config is not None:  # the first worker writes for all
            write_outputs(args, results, config, tracker)
    return results


def keep_measured(args, results, config, tracker, kvstores, stop, out):
    """On a stop in a comparison: print and write what the finished kvstores measured.

    Returns ``(finished, pending, written)``: the kvstores whose runs
    finished, those that did not, and the output paths written (marked partial).
    """
    finished = [r.kvstore for r in results]
    pending = kvstores[len(results):]
    if not results or config is None:
        return finished, pending, []
    name = signal.Signals(stop.signum).name if stop is not None and stop.signum else 'a stop'
    print(gm.comparison_table(results, tracker), file=out)
    print(gm.recommend(results, pending=pending), file=out, flush=True)
    why = f'interrupted by {name} before kvstore {pending[0]} had finished'
    return finished, pending, write_outputs(args, results, config, tracker, pending,
                                            partial_note(pending, finished, why))


class StoppedBetweenRuns(gm.Interrupted):
    """A signal at the end of one kvstore's run: the next runs are not begun."""

    def __init__(self, num_epochs, done, left):
        super().__init__(num_epochs, None, epoch_done=True)
        self.done, self.left = done, left


def join_parameter_server(kvstores, stop=None):
    """Join the parameter server if a dist kvstore was asked for; return this ``Worker``.

    A signal (``stop``) or the join's time-out raises ``distributed.JoinError``.
    """
    dist = next((k for k in kvstores if k in gm.kvstores.DIST_KVSTORES), None)
    _PHASE['joining'] = dist is not None
    try:
        return gm.distributed.join(kvstores, start=f'{common.program("launch")} -n WORKERS -s '
                                   f'SERVERS -- {common.program("train")} --kvstore {dist} ...',
                                   stop=stop)
    finally:
        _PHASE['joining'] = False


#: Whether the process waits to join the parameter server (a signal then ends it, not a step).
_PHASE = {'joining': False}


def stopped_by_launcher(step):
    """Say that the launcher stops the job, on a step every worker stops on."""
    say_quietly(f'the launcher stops the job: stopping after step {step}, as every worker does')


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


def resume_command(argv):
    """The command line that continues an interrupted run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--resume' not in argv:
        argv.append('--resume')
    return common.command_line('train', argv)


def interrupted_message(stop, error, checkpoint_dir, argv):
    """One line on an ``Interrupted`` stop: where it stopped, where the checkpoint is, what next."""
    name = signal.Signals(stop.signum).name if stop.signum else 'a stop request'
    comparison = getattr(error, 'comparison', None)
    if isinstance(error, StoppedBetweenRuns):
        where = (f'interrupted by {name} at the end of the run with kvstore {error.done}: the '
                 f'runs with {", ".join(error.left)} were not begun')
    else:
        when = f'in epoch {error.epoch} after {error.batches} batch(es)'
        if error.epoch_done:
            when = (f'after epoch {error.epoch} had finished its steps, before epoch '
                    f'{error.epoch + 1} began')
        where = f'interrupted by {name} {when}'
        if comparison is not None:
            where = f'interrupted by {name} during the run with kvstore {comparison[1][0]} ({when})'
    if comparison is not None:
        return f'{where}; {kept_message(*comparison)}'
    if checkpoint_dir and os.path.isfile(os.path.join(checkpoint_dir, 'manifest.json')):
        return (f'{where}; checkpoint in {os.path.abspath(checkpoint_dir)}; resume with: '
                f'{resume_command(argv)}')
    return f'{where}; no checkpoint written (add --checkpoint-dir DIR to be able to resume)'


def kept_message(finished, pending, written):
    """What a stopped comparison kept: the finished kvstores' results, and where."""
    if not finished:
        return 'no kvstore had finished: no output was written'
    runs = f'kvstore {", ".join(finished)}'
    if not written:
        return f'the results of {runs} are printed above (no output was asked for)'
    where = ', '.join(written[:-1]) + ' and ' + written[-1] if len(written) > 1 else written[0]
    return f'the results of {runs} are kept, marked partial, in {where}'


def acknowledge(signum, book=False, launched=False):
    """Say at once that a first signal was heard (quietly nothing if the terminal is gone).

    The text's loop (``book``) queues steps ahead of the devices without a
    bound, up to an epoch's end: it stops after the steps already queued. A
    worker of ``scripts/launch.py`` (``launched``) runs in a session of its
    own, without a terminal: its signals come from the launcher, and nobody
    can press Ctrl-C there.
    """
    name = {signal.SIGINT: 'Ctrl-C', signal.SIGHUP: 'SIGHUP (the terminal closed)'}.get(
        signum, signal.Signals(signum).name)
    if launched:
        name = f'{signal.Signals(signum).name} from the launcher'
    if _PHASE['joining']:
        say_quietly(f'{name}: stopping while joining the parameter server')
        return
    when = ("once the steps already queued have run (the text's loop queues them ahead of the "
            "devices, up to the epoch's end)" if book else 'after the current step')
    say_quietly(f'{name}: stopping {when}' + ('' if launched else '; Ctrl-C again to stop now'))


def stop_now(signum):  # pylint: disable=unused-argument
    """Say that a second signal ends the run at once."""
    say_quietly('stopped at once (a second signal): the last complete checkpoint, if any, is '
                'kept')


def finished_anyway(signum, args):
    """One line for a signal that came after the last step: the run finished all the same."""
    done = ['the run is complete']
    if args.json or args.plot or args.report:
        done.append('its outputs are written')
    if args.checkpoint_dir:
        done.append('its checkpoint holds it')
    done = ', '.join(done[:-1]) + ' and ' + done[-1] if len(done) > 1 else done[0]
    return (f'{signal.Signals(signum).name} came after the last step: {done}; exit status '
            f'{128 + signum}, as for any stop by a signal')


@contextlib.contextmanager
def stop_request(on_signal, on_second):
    """A ``StopRequest`` for the run; in the program, once it has stopped the run, the stop
    signals are ignored.

    The status is then 128 + the first signal, as the last line says: a
    signal that comes later, while the process ends, changes neither (one
    within the window is the same request anyway, ``StopRequest``). Called
    as a function (``main``, the tests), the process's handlers are left as they were.
    """
    stop = gm.StopRequest(on_signal, on_second)
    try:
        with stop:
            yield stop
    finally:
        if stop.signum is not None and _PROGRAM['started']:
            for signum in common.STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)


def main(argv=None):
    """Run the script; return the exit status.

    0 when done, 2 for bad input or a diverged run, 1 when an output cannot be
    written (disk full, file too large), 3 when the steps stalled (``stall_guard``),
    128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP) when a
    signal came, also after the last step (the run is then complete, and says so).
    """
    args = parse_args(argv)
    # Past a file-size limit a write then fails (EFBIG) instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with common.quiet_console():  # a closed terminal (SIGHUP) must not turn a print into an error
        return _main(args, argv)


def _main(args, argv):
    # Started by the launcher's agent (its control pipes are set): signals come from the launcher.
    launched = bool(os.environ.get(gm.agent.CONTROL_VARIABLE))
    try:
        with stop_request(lambda signum: acknowledge(signum, args.book_literal, launched),
                          stop_now) as stop:
            common.run_began()  # from its end on, a signal finds the run over, not starting
            run(args, stop=stop)
    except gm.distributed.JoinError as e:
        # MXNet's join cannot be called off: end the process, whose thread waits there for good.
        print(e.describe(FLAGS) if e.signum else error_line(e), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(128 + e.signum if e.signum else 1)  # pylint: disable=protected-access
    except gm.GluonMultiGPUError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    except OSError as e:  # a disk that fills, a file-size limit, ... while writing
        where = f' {e.filename}' if e.filename else ''
        print(f'error: could not write{where}: {e.strerror or e}; free space or choose another '
              'place (the last complete checkpoint, if any, is kept)', file=sys.stderr)
        return 1
    except gm.Interrupted as e:
        print(interrupted_message(stop, e, args.checkpoint_dir, argv), file=sys.stderr)
        return 128 + (stop.signum or signal.SIGINT)
    except KeyboardInterrupt:
        stop_now(signal.SIGINT)
        return 130
    if stop.signum:  # in the last evaluation, or while the outputs were written
        print(finished_anyway(stop.signum, args), file=sys.stderr)
        return 128 + stop.signum
    return 0


#: Whether this process is the program (``start``), which ends once ``main`` returns.
_PROGRAM = {'started': False}


def start(launcher=None):
    """The program: ``gluon-multigpu-train``, or ``scripts/train.py`` (``launcher``, its path)."""
    _PROGRAM['started'] = True
    common.start(main, launcher)


if __name__ == '__main__':
    start()

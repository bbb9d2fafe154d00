"""Train the book's ResNet-18 (or the lab's simple CNN) data-parallel on several devices.

The loop of d2l 13.6 "Concise Implementation for Multiple GPUs": parameters on
every device, each batch split across them, gradients summed by the kvstore.
Without GPUs, ``--cpu-devices N`` runs the same code on N CPU contexts.

The program: its command line, its stops and its exit statuses. What a run
does once parsed is ``train_run``'s (every check and setting of it the
library's); what it says when it stops, ``messages``'. Importing this module
loads no MXNet: the program sets the engine up first (``console.start``), and
the parser and the run load the package's modules only when called.
"""
import functools
import os
import signal
import sys

from . import console, messages
from .arguments import (add_run_flags, batch_size, error_line, int_in, non_negative_float,
                        num_epochs, path_of, positive_float, script_parser, split_weights)
from .console import quiet_console, say_quietly, stop_request
from ..base import signals
from ..base.protocol import CONTROL_VARIABLE
from ..core.recipes import MAX_IN_FLIGHT, RECIPES
from ..errors import GluonMultiGPUError, Interrupted

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
to it; on CPU contexts a batch whose estimated memory (about 6 MB per sample
for resnet18, 0.32 MB for simple-cnn, plus the process) exceeds the memory
available is refused, naming the largest that fits. Ctrl-C (SIGINT), SIGTERM
or SIGHUP (the terminal closed) stops after the current step (during an
evaluation: at that epoch's end), writes a checkpoint with --checkpoint-dir,
says how to resume, and exits with 130, 143 or 129; a second Ctrl-C (half a
second or more after the first: a wrapper such as timeout repeats one Ctrl-C)
stops at once. A signal after the last step lets the run finish, says so, and
exits with the same status. Several kvstores are compared in turn, epoch after
epoch (epoch 1 of each, then epoch 2 of each backwards, ...), so that a change
of the machine's load falls on all of them; the answer compares the epochs of
the same round and names a faster kvstore only when the 95%% interval of the
ratio excludes 1 and the difference is 3%% or more, with the load measured
during the run beside it. The first measured steps give the time the whole
comparison takes, each progress line the time left for it; the outputs are
written after each round, marked partial until the last, and a stop keeps
every epoch measured (printed, and written marked partial).
""".format(defaults='\n'.join(f'  {name:<12} {r.describe}' for name, r in RECIPES.items()))


def build_parser():
    """Return the argument parser of this script."""
    # pylint: disable=import-outside-toplevel  (the choices load MXNet: after the engine set-up)
    from ..core.data import DATASETS
    from ..core.kvstores import DIST_KVSTORES, KVSTORES
    from ..core.model import MODELS
    from ..features.precision import DTYPES
    p = script_parser(__doc__, EPILOG,
                      'train on gpu(0)..gpu(N-1) (default: all GPUs, or the CPU if none)',
                      'train on N CPU contexts cpu(0)..cpu(N-1) instead of GPUs')
    p.add_argument('--kvstore', nargs='+', choices=KVSTORES + DIST_KVSTORES, default=['device'],
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
    add_run_flags(p, MODELS, DATASETS, 'the same for every kvstore')
    p.add_argument('--download', action='store_true',
                   help="download missing files from MXNet's mirror (needs internet)")
    add_output_flags(p)
    add_metrics_flags(p)
    add_profile_flags(p)
    add_loop_flags(p, DTYPES)
    add_update_flags(p)
    return p


def add_output_flags(p):
    """The files a run writes: --plot, --json, --report, --checkpoint-dir (and --resume)."""
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


def add_profile_flags(p):
    """A profile of chosen steps: --profile, --profile-file."""
    p.add_argument('--profile', metavar='START:STOP',
                   help="profile training steps START to STOP with MXNet's profiler (steps "
                   'count from 1 across epochs: step S of epoch E is (E-1) x steps per epoch + '
                   'S; N alone: step N): only their operators, one at a time (no bulking), '
                   'written to --profile-file as a Chrome trace (JSON, for Perfetto or '
                   'chrome://tracing) with a track per device, and the ten costliest '
                   'operators printed when the profile ends; a stop inside the range writes the '
                   'steps profiled and says so. One kvstore, not with --book-literal; on a '
                   'parameter server the first worker profiles (default: no profile)')
    p.add_argument('--profile-file', metavar='PATH', type=path_of('a file name'),
                   help='where --profile writes its trace, replaced whole (default: '
                   'profile.json)')


def add_metrics_flags(p):
    """Figures for a dashboard: --tensorboard, --metrics, --log-every."""
    p.add_argument('--tensorboard', metavar='DIR', type=path_of('a directory'),
                   help='write TensorBoard event files into DIR, created if missing (needs '
                   'pip install tensorboardX): every --log-every steps the training loss and '
                   'accuracy of the steps since the last figures, the learning rate, images/s '
                   'and the gradient norm; after each epoch its train loss and accuracy, test '
                   'accuracy, seconds and images/s. A run continued with --resume goes on with '
                   'the same curves (what the stopped run wrote past its checkpoint is dropped). '
                   'On a parameter server the first worker writes')
    p.add_argument('--metrics', metavar='PATH', type=path_of('a file name'),
                   help='write the same figures as JSON lines to PATH, one object per line '
                   '({"kind": "step" or "epoch", "step": global step, "epoch", "time", '
                   '"values"}), each line written as it comes; replaced at the start of a run, '
                   'continued by --resume')
    p.add_argument('--log-every', type=int_in(1, 10**6), default=50, metavar='N',
                   help='steps between two step figures of --tensorboard and --metrics; reading '
                   'them waits for the devices once (default: 50)')


def add_update_flags(p):
    """How gradients become updates: --accumulate, --clip-grad-norm, --lr-schedule, --warmup-steps."""
    # pylint: disable=import-outside-toplevel  (loads MXNet: after the engine set-up)
    from ..core.updates import MAX_ACCUMULATE, SCHEDULES
    p.add_argument('--accumulate', type=int_in(1, MAX_ACCUMULATE), default=1, metavar='K',
                   help='sum the gradients of K batches before one update, normalised by all '
                   'their samples: the update of one batch K times as large, in the memory of '
                   'one (an epoch\'s last, shorter group is an update too; a stop waits for '
                   'the group to end). Without BatchNorm equal to the large batch; with it each '
                   'batch keeps its own statistics (default: 1, the book)')
    p.add_argument('--clip-grad-norm', type=positive_float, metavar='X',
                   help='scale each update\'s summed gradient down to global norm X when it is '
                   'larger: the norm over every parameter of the gradient per sample, as one '
                   'device with the whole batch would compute it; the norm before clipping is in '
                   'the progress lines and --json (not on a parameter server: its servers update '
                   'each parameter on its own)')
    p.add_argument('--lr-schedule', choices=SCHEDULES, default='constant',
                   help='learning rate of each update: constant (the book); step (divided by 10 '
                   'at half and three quarters of the run); cosine (down to 0 along a half '
                   'cosine); onecycle (up from LR/25, then down to LR/10^4). The run\'s length '
                   'is --num-epochs: a resumed run must keep it. The rate of every update is in '
                   '--json (default: constant)')
    p.add_argument('--warmup-steps', type=int_in(0, 10**8), default=0, metavar='N',
                   help='updates whose rate rises linearly to --lr before the schedule '
                   '(onecycle: its rise; default: 0)')


def add_loop_flags(p, dtypes):
    """How the loop trains: the text's loop or the fast path, the split, BatchNorm, the dtype."""
    p.add_argument('--book-literal', action='store_true',
                   help="run the text's loop (nn.Block residuals, no hybridization, no "
                   'training loss or accuracy) instead of the fast path')
    p.add_argument('--max-in-flight', type=int_in(0, 1000), default=MAX_IN_FLIGHT, metavar='K',
                   help='steps MXNet may run behind Python: after queuing a step, wait for the '
                   'one K steps back, so Ctrl-C and progress act within a step; 0 = no bound, '
                   f"the book's loop (default: {MAX_IN_FLIGHT})")
    p.add_argument('--split', type=split_weights, default=None, metavar='even|auto|W1,W2,...',
                   help='how each batch is shared among the devices, for devices of different '
                   'speed: even (the book); auto, shares measured from each device\'s step time '
                   'during the first steps and re-balanced when the times drift (a line after '
                   'each epoch gives the shares, the changes of the shares and how many were '
                   '"undone": moved back because the next steps were not faster); or one relative '
                   'weight per device, e.g. 1,3 gives the second device three times the samples '
                   'of the first (default: even)')
    p.add_argument('--sync-bn', action='store_true',
                   help='ResNet-18 with synchronised BatchNorm: the mean and variance of each '
                   'BatchNorm layer over all devices\' shards, as one device with the whole batch '
                   'would compute them, and the same running statistics on every device (needs '
                   'the even split and a batch size divisible by the devices; the samples that '
                   'would make the last batch uneven are dropped; MXNet\'s SyncBatchNorm, '
                   'slower per step)')
    p.add_argument('--dtype', choices=dtypes, default='float32',
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
    p.add_argument('--stall-timeout', type=non_negative_float, default=0.0, metavar='SECONDS',
                   help='a run that queues no training step for this long is stuck (a deadlock, '
                   'a worker or server that cannot answer): every thread\'s Python stack is '
                   'printed, then one line, and the exit status is 3; evaluation is not watched; '
                   'under scripts/launch.py the launcher watches every worker and names the one '
                   'behind, on its host and rank, with its step; needs --max-in-flight 1 or more '
                   '(default: 0, not watched)')


def parse_args(argv=None):
    """Parse the command line (``sys.argv[1:]`` when ``argv`` is None)."""
    return build_parser().parse_args(argv)


def resume_command(argv):
    """The command line that continues an interrupted run (``argv`` None: this one's)."""
    return console.resume_command('train', argv)


def interrupted_message(signum, error, checkpoint_dir, argv, rank=0):
    """One line on an ``Interrupted`` stop: where it stopped, where the checkpoint is, what next.

    A worker after the first (``rank``) of a parameter-server job saves no
    checkpoint: the first does, and the line says so.
    """
    kept = getattr(error, 'comparison', None)
    if kept is None and checkpoint_dir:
        saved = os.path.isfile(os.path.join(checkpoint_dir, 'manifest.json'))
        return messages.train_stopped(signum, error, resume_command(argv),
                                      os.path.abspath(checkpoint_dir), by_rank_0=bool(rank),
                                      saved=saved or bool(rank))
    return messages.train_stopped(signum, error, kept=kept)


def main(argv=None):
    """Run the script; return the exit status.

    0 when done, 2 for bad input or a diverged run, 1 when an output cannot be
    written (disk full, file too large), 3 when the steps stalled
    (``--stall-timeout``, ``train_run.stall_guard``),
    128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP) when a
    signal came, also after the last step (the run is then complete, and says so).
    """
    args = parse_args(argv)
    # Past a file-size limit a write then fails (EFBIG) instead of killing the process.
    signals.ignore((signal.SIGXFSZ,))
    # pylint: disable=import-outside-toplevel  (the run loads MXNet: after the engine set-up)
    from .train_run import joining, run
    # Started by the launcher's agent (its control pipes are set): signals come from the launcher.
    launched = bool(os.environ.get(CONTROL_VARIABLE))

    def heard(signum):
        say_quietly(messages.train_heard(signum, args.book_literal, launched, joining()))
    stop = None
    with quiet_console():  # a closed terminal (SIGHUP) must not turn a print into an error
        try:
            with stop_request(heard, functools.partial(stop_now, args=args), ignore_after=True) \
                    as stop:
                run(args, stop=stop)
        except (GluonMultiGPUError, OSError, Interrupted, KeyboardInterrupt) as e:
            return _ended(e, stop, args, argv)
        if stop.signum:  # in the last evaluation, or while the outputs were written
            print(messages.train_finished_anyway(stop.signum, bool(args.json or args.plot or
                                                                   args.report),
                                                 bool(args.checkpoint_dir)), file=sys.stderr)
            return 128 + stop.signum
    return 0


def _ended(error, stop, args, argv):
    """Say how the run ended on ``error`` (caught once, in ``main``); return the exit status."""
    # pylint: disable=import-outside-toplevel  (MXNet is loaded by now)
    from ..features.distributed import JoinError
    from .train_run import worker_rank
    signum = getattr(stop, 'signum', None)
    if isinstance(error, JoinError):
        # MXNet's join cannot be called off: end the process, whose thread waits there for good.
        _end_joining(error_line(error), 1)
    if isinstance(error, GluonMultiGPUError):
        print(error_line(error), file=sys.stderr)
        return 2
    if isinstance(error, OSError):  # a disk that fills, a file-size limit, ... while writing
        print(messages.could_not_write(error, _kept(args, argv)), file=sys.stderr)
        return 1
    if isinstance(error, KeyboardInterrupt):
        stop_now(signal.SIGINT, args)
        return 130
    if error.joining:  # as after a time-out: the thread that waits to join stays blocked
        _end_joining(str(error), 128 + (error.signum or signal.SIGINT))
    if error.now:  # a second request, heard without a reader: no checkpoint, no outputs
        stop_now(error.signum, args)
        return 128 + error.signum
    print(interrupted_message(signum, error, args.checkpoint_dir, argv, worker_rank()),
          file=sys.stderr)
    return 128 + (signum or signal.SIGINT)


def _kept(args, argv):
    """What a failed write left as it was, naming only what exists."""
    said = []
    outputs = [flag for flag, path in (('--plot', args.plot), ('--json', args.json),
                                       ('--report', args.report)) if path]
    if outputs:
        said.append(f'{", ".join(outputs)}: as before this write')
    logs = [flag for flag, path in (('--metrics', getattr(args, 'metrics', None)),
                                    ('--tensorboard', getattr(args, 'tensorboard', None))) if path]
    if logs:
        said.append(f'{", ".join(logs)}: the figures written before it')
    if args.checkpoint_dir:
        said.append(_checkpoint_kept(args, argv))
    return '; '.join(said) or 'no other file was asked for'


def _checkpoint_kept(args, argv=None):
    """What is left of ``--checkpoint-dir``, named only if it exists (None: none asked for)."""
    if not args.checkpoint_dir:
        return None
    if os.path.isfile(os.path.join(args.checkpoint_dir, 'manifest.json')):
        return (f'the last complete checkpoint in {args.checkpoint_dir} is kept; resume with: '
                f'{resume_command(argv)}')
    return f'no checkpoint was saved in {args.checkpoint_dir}'


def _end_joining(line, status):
    """Say ``line`` and end the process with ``status`` at once: MXNet's join cannot be called
    off, and its thread would keep the process alive."""
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)  # pylint: disable=protected-access


def stop_now(signum, args=None):  # pylint: disable=unused-argument
    """Say that a second signal ends the run at once, and what checkpoint is left."""
    say_quietly(messages.train_stopped_now(_checkpoint_kept(args) if args else None))


def start(launcher=None):
    """The program: ``gluon-multigpu-train``, or ``scripts/train.py`` (``launcher``, its path)."""
    with console.command(launcher):  # the engine set up first; MXNet's load errors in one line
        sys.exit(main())


if __name__ == '__main__':
    start()

"""Train the book's ResNet-18 (or the lab's simple CNN) data-parallel on several devices.

The loop of d2l 13.6 "Concise Implementation for Multiple GPUs": parameters on
every device, each batch split across them, gradients summed by the kvstore.
Without GPUs, ``--cpu-devices N`` runs the same code on N CPU contexts.

The program: its command line, its stops and its exit statuses. What a run
does once parsed is ``runs.train_run``'s (every check and setting of it the
library's); what it says when it stops, ``messages``'. Importing this module
loads no MXNet: the program sets the engine up first (``console.command``), and
the parser and the run load the package's modules only when called.
"""
import argparse
import functools
import os
import signal
import sys
import textwrap

from . import console, messages
from .arguments import OneLineParser, add_config_flags, error_line
from ..base import signals
from ..base.protocol import CONTROL_VARIABLE
from ..machinery.config import RunConfig
from ..section.recipes import RECIPES
from ..errors import GluonMultiGPUError, Interrupted

EPILOG = """\
defaults per model (--batch-size, --lr):
{defaults}

examples:
  %(prog)s --num-gpus 2          # the book's 2-GPU run (batch 512, lr 0.2)
  %(prog)s --cpu-devices 2 --model simple-cnn --num-epochs 2 --data-dir DIR
  %(prog)s --cpu-devices 2 --kvstore local device --json runs.json
  %(prog)s --num-gpus 2 --kvstore local device nccl none --report kvstores/

Bad input stops before training with one line and exit status 2; Ctrl-C,
SIGTERM or SIGHUP stop after the current step, save a checkpoint with
--checkpoint-dir and say how to resume (exit 130, 143, 129); a failed write
exits 1, a stalled run 3. What each flag does, in full: help(gm.RunConfig)
and docs/guide.md.
""".format(defaults='\n'.join(textwrap.fill(f'{name}: {r.describe}', 78, initial_indent='  ',
                                         subsequent_indent='    ') for name, r in RECIPES.items()))


def build_parser():
    """Return the argument parser of this script: one flag per field of ``RunConfig``."""
    p = OneLineParser(description="Train the book's ResNet-18 (or the lab's simple CNN) on "
                                  'several devices.', epilog=EPILOG,
                      usage='%(prog)s [--num-gpus N | --cpu-devices N] [options]',
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flags(p, RunConfig, exclusive=('num_gpus', 'cpu_devices'))
    return p


def parse_args(argv=None):
    """The ``RunConfig`` of the command line (``sys.argv[1:]`` when ``argv`` is None).

    A bad flag or value exits with status 2 (argparse); settings that cannot go
    together raise ``GluonMultiGPUError``.
    """
    return RunConfig(**vars(build_parser().parse_args(argv)))


#: The command line that continues an interrupted run: ``resume_command(argv)`` (None: this one's).
resume_command = functools.partial(console.resume_command, 'train')


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
    try:
        config = parse_args(argv)
    except GluonMultiGPUError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    # Past a file-size limit a write then fails (EFBIG) instead of killing the process.
    signals.ignore((signal.SIGXFSZ,))
    # pylint: disable=import-outside-toplevel  (the run loads MXNet: after the engine set-up)
    from ..runs.train_run import joining, run
    # Started by the launcher's agent (its control pipes are set): signals come from the launcher.
    launched = bool(os.environ.get(CONTROL_VARIABLE))

    def heard(signum):
        console.say_quietly(messages.train_heard(signum, config.book_literal, launched, joining()))
    stop = None
    with console.quiet_console():  # a closed terminal (SIGHUP) must not turn a print into an error
        try:
            with console.stop_request(heard, functools.partial(stop_now, config=config),
                                      ignore_after=True) as stop:
                run(config, stop=stop, program=console.program, resume=resume_command)
        except (GluonMultiGPUError, OSError, Interrupted, KeyboardInterrupt) as e:
            return _ended(e, stop, config, argv)
        if stop.signum:  # in the last evaluation, or while the outputs were written
            outputs = bool(config.json or config.plot or config.report)
            print(messages.train_finished_anyway(stop.signum, outputs, bool(config.checkpoint_dir)),
                  file=sys.stderr)
            return 128 + stop.signum
    return 0


def _ended(error, stop, config, argv):
    """Say how the run ended on ``error`` (caught once, in ``main``); return the exit status."""
    # pylint: disable=import-outside-toplevel  (MXNet is loaded by now)
    from ..features.distributed import JoinError
    from ..runs.train_run import worker_rank
    signum = getattr(stop, 'signum', None)
    if isinstance(error, JoinError):
        # MXNet's join cannot be called off: end the process, whose thread waits there for good.
        _end_joining(error_line(error), 1)
    if isinstance(error, GluonMultiGPUError):
        print(error_line(error), file=sys.stderr)
        return 2
    if isinstance(error, OSError):  # a disk that fills, a file-size limit, ... while writing
        print(messages.could_not_write(error, _kept(config, argv)), file=sys.stderr)
        return 1
    if isinstance(error, KeyboardInterrupt):
        stop_now(signal.SIGINT, config)
        return 130
    if error.joining:  # as after a time-out: the thread that waits to join stays blocked
        _end_joining(str(error), 128 + (error.signum or signal.SIGINT))
    if error.now:  # a second request, heard without a reader: no checkpoint, no outputs
        stop_now(error.signum, config)
        return 128 + error.signum
    print(interrupted_message(signum, error, config.checkpoint_dir, argv, worker_rank()),
          file=sys.stderr)
    return 128 + (signum or signal.SIGINT)


def _kept(config, argv):
    """What a failed write left as it was, naming only what exists."""
    said = [f'{", ".join(given)}: {left}'
            for names, left in (('plot json report', 'as before this write'),
                                ('metrics tensorboard', 'the figures written before it'))
            if (given := [f'--{name}' for name in names.split() if getattr(config, name)])]
    said += filter(None, [_checkpoint_kept(config, argv)])  # None: no --checkpoint-dir
    return '; '.join(said) or 'no other file was asked for'


def _checkpoint_kept(config, argv=None):
    """What is left of ``--checkpoint-dir``, named only if it exists (None: none asked for)."""
    if not config.checkpoint_dir:
        return None
    if os.path.isfile(os.path.join(config.checkpoint_dir, 'manifest.json')):
        return (f'the last complete checkpoint in {config.checkpoint_dir} is kept; resume with: '
                f'{resume_command(argv)}')
    return f'no checkpoint was saved in {config.checkpoint_dir}'


def _end_joining(line, status):
    """Say ``line`` and end the process with ``status`` at once: MXNet's join cannot be called
    off, and its thread would keep the process alive."""
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)  # pylint: disable=protected-access


def stop_now(signum, config):  # pylint: disable=unused-argument
    """Say that a second signal ends the run at once, and what checkpoint is left."""
    console.say_quietly(messages.train_stopped_now(_checkpoint_kept(config)))


def start(launcher=None):
    """The program: ``gluon-multigpu-train``, or ``scripts/train.py`` (``launcher``, its path)."""
    with console.command(launcher):  # the engine set up first; MXNet's load errors in one line
        sys.exit(main())


if __name__ == '__main__':
    start()

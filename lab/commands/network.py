"""Measure parameter-server steps on a cluster with shaped links, beside the network model.

For each model and worker count, a cluster of W + 2 network namespaces on
this machine (``lab.hosts.cluster``: scheduler, one server and W
workers, each on a host of its own) runs ``scripts/launch.py --launcher
ssh`` with ``scripts/train.py --kvstore dist_sync --cpu-devices 1`` on
random data, once unshaped and once with every link shaped to each
bandwidth. Each row gives the measured seconds per step beside
``t_unshaped(W) + t_net(W, B)``, ``t_net`` from
``lab.studies.scaling_model.worker_projection``: the hosts share this
machine's cores, and the unshaped run measures the step under that sharing
(``lab.studies.network_study`` says how). Needs root, ``ip netns``,
``tc`` and OpenSSH's sshd.
"""
import argparse
import os
import signal
import sys
import tempfile
import time

from lab.commands import common
from lab.commands.common import int_in, non_negative_float
from gluon_multigpu.errors import GluonMultiGPUError, Interrupted
from gluon_multigpu.base import signals
from gluon_multigpu.filesafety import files, output, targets
from lab.hosts import cluster
from lab.studies import network_study as network
from gluon_multigpu.base.machine import stamp
from lab.studies.jobs import machine

EPILOG = """\
figures (seconds per training step; a step is rank 0's second epoch / its steps):
  unshaped      the same workers on the same cluster with unshaped links: their compute
                on this machine's shared cores, with a network that costs next to nothing
  predicted     unshaped + t_net(W, B), t_net = (G + L) max(1, W / S) / B: G the gradient
                bytes, L the largest key's, S = 1 server, B the TCP payload of the link's
                rate each way (95.6%%); scaling.worker_projection
  full overlap  max(unshaped, t_net): the step if either hid entirely behind the other
  old model     unshaped + 2 G max(1, W / S) / rate: the model before it was measured
  others        cores the machine's other processes used during the runs of the row

examples:
  %(prog)s                                   both models, 2 and 3 workers, 100mbit and 1gbit
  %(prog)s --quick                           simple-cnn, 2 workers, 1gbit, 5 steps: seconds
  %(prog)s --models resnet18 --workers 2 --bandwidths 200mbit --steps 2 --out net/

--out DIR gets results.json (every figure, every run's epochs, the command and
the machine), results.md (the table) and logs/ (each run's launcher output),
rewritten after every row, so a run that stops keeps what was measured. A run
during which other processes used more than --max-others cores is measured
again (--retries). Bad input, or a machine where no cluster can be made (not
root, no ip netns, no sshd), stops before measuring with one line on stderr
and exit status 2; a run that fails, or processes left on a host, end with
status 1 after the others; Ctrl-C or SIGTERM stops the run in progress, keeps
the rows measured, and exits with 130 or 143.
"""


def bandwidth(text):
    """argparse type: a tc rate such as ``100mbit``, ``1gbit`` or ``10mbps``."""
    try:
        cluster.rate_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def build_parser():
    """Return the argument parser of this script."""
    p = common.OneLineParser(description=__doc__.splitlines()[0], epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', nargs='+', choices=list(network.MODELS), metavar='MODEL',
                   help=f'networks: {", ".join(network.MODELS)} (default: both; simple-cnn '
                   'with --quick)')
    p.add_argument('--workers', nargs='+', type=int_in(1, 32), metavar='W',
                   help='worker counts, one cluster of W + 2 hosts each (default: 2 3; 2 with '
                   '--quick)')
    p.add_argument('--bandwidths', nargs='+', type=bandwidth, metavar='RATE',
                   help='link rates, tc units (default: 100mbit 1gbit; 1gbit with --quick)')
    p.add_argument('--steps', type=int_in(1, 100_000), metavar='N',
                   help='steps per epoch, two epochs, the second timed (default: enough for a '
                   f'timed epoch of {network.TIMED_SECONDS:g} s by estimate, at least '
                   + ', '.join(f'{m} {s}' for m, s in network.DEFAULT_STEPS.items())
                   + f'; {network.QUICK_STEPS} with --quick)')
    p.add_argument('--batch-size', type=int_in(1, 100_000), metavar='N',
                   help='samples per worker per step (default: '
                   + ', '.join(f'{m} {b}' for m, b in network.DEFAULT_BATCH.items()) + ')')
    p.add_argument('--threads', type=int_in(0, 1024), default=network.WORKER_THREADS,
                   metavar='N', help="each worker's OpenMP threads (OMP_NUM_THREADS); 0 leaves "
                   'them to train.py, a thread per core (default: '
                   f'{network.WORKER_THREADS}: the hosts share this machine\'s cores)')
    p.add_argument('--out', metavar='DIR', type=common.path_of('a directory'),
                   help='write results.json, results.md and logs/ into DIR (created if '
                   'missing), after every row')
    p.add_argument('--max-others', type=non_negative_float, default=0.2, metavar='CORES',
                   help='measure a run again when the machine\'s other processes used more '
                   'cores than this meanwhile (default: 0.2)')
    p.add_argument('--retries', type=int_in(0, 100), metavar='N',
                   help='times a disturbed or failed run is measured again (default: 2; 0 '
                   'with --quick)')
    p.add_argument('--quick', action='store_true',
                   help=f'simple-cnn, 2 workers, 1gbit, {network.QUICK_STEPS} steps, no '
                   'retries, unless given otherwise: checks that everything runs (seconds)')
    return p


def _write(out_dir, config, rows, runs):
    """Rewrite results.json and results.md in ``out_dir``, together (all or nothing: a
    ``ReportSet``, so that a failure or kill never leaves one file of a run beside the other's)."""
    with output.ReportSet(out_dir) as report:
        files.write_json(report.path('results.json'),
                         {'config': config, 'rows': rows, 'runs': runs, **stamp()})
        with output.atomic_write(report.path('results.md')) as f:
            f.write(f"Measured with `{config['command']}` on {config['machine']['cpu']} "
                    f"({config['machine']['cores']} cores), {config['date']}.\n\n")
            f.write(network.markdown_table(rows))


def run(args, argv):
    """Check the input, run the study, print the table; return the exit status (0 or 1)."""
    quick = args.quick
    models = args.models or (['simple-cnn'] if quick else list(network.MODELS))
    workers = args.workers or ([2] if quick else [2, 3])
    bandwidths = args.bandwidths or (['1gbit'] if quick else list(network.BANDWIDTHS))
    steps = args.steps or (network.QUICK_STEPS if quick else None)
    retries = args.retries if args.retries is not None else (0 if quick else 2)
    models, workers, bandwidths = (list(dict.fromkeys(x)) for x in (models, workers, bandwidths))
    if args.out:
        targets.check_output_dir(args.out, '--out')
    ok, why = cluster.available()
    if not ok:
        raise GluonMultiGPUError(f'the network study runs on a cluster of network namespaces, and '
                                 f'none can be made here: {why}')
    runs = network.plan(models, workers, bandwidths, args.batch_size, steps, args.threads)
    config = {'command': common.command_line('network', argv), 'machine': machine(),
              'date': time.strftime('%Y-%m-%d %H:%M %Z'), 'models': models, 'workers': workers,
              'bandwidths': bandwidths, 'servers': network.SERVERS, 'threads': args.threads,
              'batch': {m: args.batch_size or network.DEFAULT_BATCH[m] for m in models},
              'steps': steps or f'enough for {network.TIMED_SECONDS:g} s, at least '
                       f'{network.DEFAULT_STEPS}',
              'timed_epoch': network.TIMED_EPOCH, 'max_others': args.max_others,
              'retries': retries, 'grad_bytes': {m: network.GRAD_BYTES[m] for m in models}}
    log_dir = None
    if args.out:
        log_dir = os.path.join(args.out, 'logs')
        output.makedirs(log_dir)

    def say(line):
        common.say_quietly(line)
    count = sum(len(c) for c in runs.values())
    estimate = sum(network.estimate_seconds(c) for cs in runs.values() for c in cs)
    say(f'network study: {count} runs on clusters of '
        f'{" and ".join(str(w + 1 + network.SERVERS) for w in workers)} hosts, about '
        f'{max(1, round(estimate / 60))} min (an estimate)')
    rows, measured = [], []
    status = 0
    # a private scratch folder of a unique name (the runs' JSON), removed whole at the end
    with tempfile.TemporaryDirectory(prefix='gluon-multigpu-network-') as workdir:
        try:
            for row, runs_of_row in network.study(runs, workdir, say, log_dir, args.max_others,
                                                  retries):
                rows.append(row)
                measured.extend(r for r in runs_of_row if r not in measured)
                if row['status'] != 'ok' or any(r['leftover'] for r in runs_of_row):
                    status = 1
                if args.out:
                    _write(args.out, config, rows, measured)
        finally:
            if rows:
                print(network.markdown_table(rows), end='', flush=True)
    if args.out and rows:
        say(f'wrote {os.path.join(args.out, "results.md")} and results.json')
    return status


def main(argv=None):
    """Run the script; return the exit status.

    0 when done; 1 when a run failed or left processes on a host; 2 for bad
    input or a machine where no cluster can be made; 130 or 143 (129) when
    stopped by SIGINT or SIGTERM (SIGHUP), keeping the rows measured.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # SIGINT, SIGTERM and SIGHUP (unless ignored) unwind the study where it is, its cluster
    # removed on the way; the signals after the first are ignored, so that they cannot break
    # into that clean-up
    with signals.raising():
        try:
            return run(args, argv)
        except (GluonMultiGPUError, network.StudyError, cluster.ClusterError) as e:
            common.say_quietly(f'error: {e}')
            return 2
        except OSError as e:
            where = f' {e.filename}' if e.filename else ''
            common.say_quietly(f'error: could not write{where}: {e.strerror or e}')
            return 1
        except (KeyboardInterrupt, Interrupted) as e:
            signum = getattr(e, 'signum', signal.SIGINT)
            kept = f'; the rows measured are in {args.out}' if args.out else ''
            common.say_quietly(f'interrupted by {signal.Signals(signum).name}: stopped the run '
                               f'in progress and removed its cluster{kept}')
            return 128 + signum


def start(launcher=None):
    """The program: ``python scripts/network.py`` (``launcher``: its path)."""
    common.start(main, launcher, engine=False)


if __name__ == '__main__':
    start()

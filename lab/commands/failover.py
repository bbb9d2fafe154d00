"""Measure what each fault costs a training job on a cluster: detection, recovery, what is left.

In lab/NOTES.md, under this module's name.
"""
import argparse
import os
import shlex
import signal
import sys
import tempfile

from lab.commands import common
from lab.commands.common import positive_float
from gluon_multigpu.errors import GluonMultiGPUError, Interrupted
from gluon_multigpu.base import signals
from gluon_multigpu.filesafety import files, output, targets
from lab.hosts import cluster
from lab.studies import failover_study as failover
from gluon_multigpu.base.machine import stamp
from lab.studies.jobs import machine

EPILOG = """\
figures (seconds from the fault, as this program reads the launcher's lines):
  detect      until the launcher's "launch: ...; stopping the job" line
  restart     until its "launch: restart 1 of 2" line: the stopped job has ended
  recover     until the first progress or epoch line of a worker after that line: the
              restarted job has completed a step (late by at most 0.1 s and a step)
  lost        the job's duration minus the uninterrupted run's (varies with the load)
  final parameters     rank 0's parameter fingerprint after the last epoch, against the
              uninterrupted run's
  fault's host empty   until the host the fault hit has no process of the job left
  left on the hosts    processes of the job on any host after the launcher has exited and
              --timeout + 8 s more have passed (sshd's session processes, which stay
              across a cut link until TCP gives up, are the ssh server's: counted apart)
  load        the 1-minute load average before and after the run

faults (--faults): worker-killed, server-killed, scheduler-killed (SIGKILL to the
process), link-down (a worker host's link cut and left down), host-gone (every
process of a worker host killed, its link cut), worker-killed-no-restart
(--max-restarts 0)

examples:
  %(prog)s --data-dir ../shared/data/fashion-mnist --out faults
  %(prog)s --faults worker-killed link-down --out faults

Needs root, iproute2 and OpenSSH (the cluster); without them, as for other bad
input (no data, an output folder that cannot be written), one line on stderr and
exit status 2. DIR/results.json and DIR/table.md are rewritten as each row is
measured (DIR/logs/ has each run's output); Ctrl-C or SIGTERM stops the run in
progress, keeps the rows measured before it, and exits with 130 or 143. Exit
status 1 when a row shows a problem (a fault not detected or not recovered, other
final parameters, a process left, a run that hung); 0 otherwise.
"""

#: The data set's four files (``gluon_multigpu.data.IDX_FILES``, without loading MXNet).
IDX_FILES = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
             't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')


def default_data_dir():
    """MXNet's usual folder of Fashion-MNIST, ``$MXNET_HOME/datasets/fashion-mnist`` (default
    ``~/.mxnet``), found without loading MXNet."""
    return os.path.join(os.path.expanduser(os.environ.get('MXNET_HOME', '~/.mxnet')),
                        'datasets', 'fashion-mnist')


def build_parser():
    """Return the argument parser of this script."""
    p = common.OneLineParser(description=__doc__.splitlines()[0], epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--faults', nargs='+', choices=list(failover.FAULTS), metavar='FAULT',
                   help='the faults to inject, in this order, after the uninterrupted run '
                   '(default: all six; see below)')
    p.add_argument('--out', metavar='DIR', type=common.path_of('a directory'),
                   default='failover-report',
                   help='folder for results.json, table.md and logs/, made if missing; its '
                   'parent must exist (default: failover-report)')
    p.add_argument('--data-dir', metavar='DIR', type=common.path_of('a directory'),
                   help='Fashion-MNIST folder with the four IDX .gz files '
                   '(default: ~/.mxnet/datasets/fashion-mnist)')
    p.add_argument('--timeout', type=positive_float, default=failover.TIMEOUT, metavar='SECONDS',
                   help="the launcher's --timeout: a host not heard for this long is lost "
                   f'(default: {failover.TIMEOUT:g})')
    return p


def check(args):
    """Check the input before anything runs; return the data folder. Raises ``UsageError``."""
    ok, why = cluster.available()
    if not ok:
        raise common.UsageError(f'no cluster can be made here: {why}')
    root = os.path.abspath(os.path.expanduser(args.data_dir or default_data_dir()))
    missing = [n for n in IDX_FILES if not os.path.isfile(os.path.join(root, n))]
    if missing:
        raise common.UsageError(f'--data-dir {root} lacks {", ".join(missing)}; give the folder '
                                'with the four Fashion-MNIST IDX .gz files')
    try:
        targets.check_output_dir(args.out, '--out')
    except GluonMultiGPUError as e:
        raise common.UsageError(e.describe(common.flag)) from None
    return root


def _write(out, report, text):
    """Rewrite results.json and table.md in ``out`` together (all or nothing: a ``ReportSet``),
    so that a failure or kill never leaves the rows of one beside those of the other."""
    with output.ReportSet(out) as folder:
        files.write_json(folder.path('results.json'), report)
        files.write_text(folder.path('table.md'), ''.join(text))


def run(args, argv, say, rows=None):
    """Check, run the study, write the rows as they come; return the rows (reference first).

    ``rows`` (a list) receives each row as it is measured, also when the study is stopped.
    """
    data_dir = check(args)
    out = os.path.abspath(args.out)
    logs = os.path.join(out, 'logs')
    try:
        output.makedirs(logs)
    except OSError as e:
        raise common.UsageError(f'--out {out}: {e.strerror or e}; give a folder that can be '
                                'written') from None
    faults = list(dict.fromkeys(args.faults or failover.FAULTS))
    command = common.command_line('failover', argv)
    report = {'command': command, 'machine': machine(), 'date': stamp()['date'],
              'settings': {'hosts': failover.HOSTS, 'workers': failover.WORKERS,
                           'servers': failover.SERVERS, 'epochs': failover.EPOCHS,
                           'steps': failover.STEPS, 'batch': failover.BATCH,
                           'timeout': args.timeout, 'max_restarts': failover.MAX_RESTARTS,
                           'fault_epoch': failover.FAULT_EPOCH, 'mid_step': failover.MID_STEP,
                           'progress_interval': failover.PROGRESS_INTERVAL,
                           'data_dir': data_dir},
              'rows': [] if rows is None else rows}
    table = os.path.join(out, 'table.md')
    head = (f'Measured with `{command}` on {report["machine"]["cpu"]} '
            f'({report["machine"]["cores"]} cores).\n\n{failover.markdown_header()}')
    text = [head]
    _write(out, report, text)
    print(failover.markdown_header(), end='', flush=True)
    say(f'{len(faults)} fault(s) after an uninterrupted run, each on a fresh cluster of '
        f'{failover.HOSTS} hosts; writing {table}')
    # a private scratch folder of a unique name (the clusters' files), removed whole at the end
    with tempfile.TemporaryDirectory(prefix='gluon-multigpu-failover-') as work:
        for row in failover.study(faults, data_dir, work, args.timeout, say, logs):
            report['rows'].append(row)
            line = failover.markdown_row(row)
            text.append(line)
            _write(out, report, text)  # both replaced whole, together: never half a row
            print(line, end='', flush=True)
    return report['rows']


def main(argv=None):
    """Run the script; return the exit status.

    0 when every row is as a fault handled well ends; 1 when a row shows a
    problem; 2 for bad input (no cluster here, no data, an output folder that
    cannot be written) or a study that cannot run; 128 + the signal number
    when stopped by SIGINT, SIGTERM or SIGHUP (the rows measured are kept).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def say(line):
        common.say_quietly(line)
    done = []
    # the first stop signal unwinds the study where it is (its clusters removed on the way);
    # those after it are ignored, so that they cannot break into that clean-up
    with signals.raising():
        try:
            done = run(args, argv, say, done)
        except (common.UsageError, failover.StudyError) as e:
            say(f'error: {e}')
            return 2
        except (Interrupted, KeyboardInterrupt) as e:
            signum = getattr(e, 'signum', signal.SIGINT)
            say(f'{signal.Signals(signum).name}: stopped the run in progress; the {len(done)} '
                f'row(s) measured before it are in {os.path.abspath(args.out)}')
            return 128 + signum
    problems = [r for r in done if r['problems']]
    for r in problems:
        say(f"problem: {r['fault']}: {', '.join(r['problems'])} (see "
            f"{shlex.quote(os.path.join(args.out, 'logs', r['fault'] + '.log'))})")
    return 1 if problems else 0


def start(launcher=None):
    """The program: ``python scripts/failover.py`` (``launcher``: its path); it
    loads no MXNet, so it sets no engine."""
    common.start(main, launcher, engine=False)


if __name__ == '__main__':
    start()

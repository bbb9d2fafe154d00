"""Measure training speed and peak memory against the steps allowed in flight (--max-in-flight).

Each measurement is one epoch of ``scripts/train.py --synthetic`` in a fresh
process (so its peak resident memory is its own), the values of K taken in
turn, round after round, so that all of them see the same machine state.
Prints, per model, the median images/s and peak memory of each K, its ratio to
the unbounded loop (K = 0) in the same rounds (every other round taken
backwards) with the ratio's 95% interval and what it says (faster or slower
only when the interval excludes 1 and the difference is 3% or more), the
load during the runs, and the smallest K within --tolerance of its speed:
the default the training script should use.

In lab/NOTES.md, under this module's name.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from gluon_multigpu.base import signals
from lab.commands import common
from lab.commands.common import stopping_main
from gluon_multigpu.filesafety.files import write_json
from gluon_multigpu.filesafety.targets import check_outputs

#: The environment of the measured runs: this process's before its own engine settings
#: (``start``; each run sets those of its --cpu-devices itself).
RUN_ENV = dict(os.environ)
#: model -> (training images, total batch): about half a minute per run on two CPU cores.
SETTINGS = {'resnet18': (1280, 128), 'simple-cnn': (30720, 128)}


def build_parser():
    """Return the argument parser of this script."""
    p = common.OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument('--cpu-devices', type=common.int_in(1, common.MAX_CPU_DEVICES), default=2,
                   metavar='N', help='CPU contexts of every run (default: 2)')
    p.add_argument('--models', nargs='+', choices=list(SETTINGS), default=list(SETTINGS),
                   help='networks to measure (default: both)')
    p.add_argument('--values', type=common.int_in(0, 1000), nargs='+', default=[1, 2, 3, 4, 0],
                   metavar='K', help='values of --max-in-flight, 0 = unbounded '
                   '(default: 1 2 3 4 0)')
    p.add_argument('--rounds', type=common.int_in(1, 20), default=2, metavar='N',
                   help='measurements of each value; medians are reported (default: 2)')
    p.add_argument('--tolerance', type=common.positive_float, default=0.02, metavar='F',
                   help='speed loss against unbounded still counted as equal (default: 0.02)')
    p.add_argument('--json', metavar='PATH', help='write every measurement as JSON')
    return p


#: Runs the train program with its arguments and reports this process's peak resident memory
#: (KiB) last.
WRAPPER = """import resource, sys
from gluon_multigpu.cli import train
try:
    train.start()
    status = 0
except SystemExit as e:
    status = e.code
print('peak-rss-kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(status)
"""


def measure(model, k, devices):
    """One epoch in a fresh process; return (images/s, peak resident MiB).

    Stopped (Ctrl-C, SIGTERM), the run is killed and its folder removed.
    """
    images, batch = SETTINGS[model]
    # a private scratch folder of a unique name (the run's JSON), removed whole at the end
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'run.json')
        proc = subprocess.run(
            [sys.executable, '-c', WRAPPER, '--cpu-devices', str(devices), '--model',
             model, '--synthetic', '--num-epochs', '1', '--num-train', str(images), '--num-test',
             str(batch), '--batch-size', str(batch), '--max-in-flight', str(k),
             '--progress-interval', '0', '--json', out],
            capture_output=True, text=True, timeout=1800, check=False, env=RUN_ENV,
            preexec_fn=signals.dying_with_parent())
        lines = proc.stderr.strip().splitlines()
        if proc.returncode:
            said = [l for l in lines if not l.startswith('peak-rss-kib ')] or ['no message']
            line = f'error: the run with K={k} failed (status {proc.returncode}): {said[-1]}'
            if proc.returncode == 2:  # bad input or a broken install (MXNet cannot load): its 2
                print(line, file=sys.stderr, flush=True)
                raise SystemExit(2)
            raise SystemExit(line)
        peak = int(lines[-1].split()[-1]) / 1024
        with open(out) as f:
            run_ = json.load(f)['runs'][0]
    return run_['samples_per_sec'], peak


def run(args, out=None):
    """Check the output, measure, print the tables, write the JSON; return the rows."""
    out = out or sys.stdout
    check_outputs(files=[('--json', args.json)])
    from gluon_multigpu.study.paired import LoadMeter  # pylint: disable=import-outside-toplevel
    rows = []
    values = list(dict.fromkeys(args.values))
    for model in args.models:
        figures = {k: {'speed': [], 'peak': [], 'load': []} for k in values}
        meter = LoadMeter()
        for r in range(args.rounds):
            for k in (values if r % 2 == 0 else values[::-1]):  # ABC, CBA: no fixed order
                meter.start()
                speed, peak = measure(model, k, args.cpu_devices)
                figures[k]['load'].append(meter.stop())
                figures[k]['speed'].append(speed)
                figures[k]['peak'].append(peak)
                print(f'{model}, round {r + 1}, K={k or "unbounded"}: {speed:.1f} images/s, '
                      f'peak {peak:.0f} MiB', file=sys.stderr, flush=True)
        rows += summarise(model, figures, args, out)
    if args.json:
        write_json(args.json, rows)
    return rows


def main(argv=None):
    """Measure, print the tables; return the exit status.

    0 when done; 1 when a run fails or the JSON cannot be written; 2 for bad
    input; 130 or 143 when stopped by SIGINT or SIGTERM.
    """
    return stopping_main(argv, build_parser, run)


def summarise(model, figures, args, out=None):
    """Print one model's table to ``out``; return its rows.

    Each K's speed is compared with the unbounded loop's of the same rounds
    (``study.paired``: the median of the paired ratios, its 95% interval;
    every run is a fresh process, so no round is left out as a warm-up);
    the K chosen is the smallest whose median ratio is within --tolerance.
    """
    from gluon_multigpu.study.paired import Paired, load_note
    from lab.studies.verdicts import versus  # pylint: disable=import-outside-toplevel
    out = out or sys.stdout
    pairs = Paired([str(k) for k in figures], higher_is_better=True, warmup=0)
    for k, f in figures.items():
        for r, (speed, load) in enumerate(zip(f['speed'], f.get('load') or
                                              [None] * len(f['speed'])), 1):
            pairs.add(str(k), r, speed, load)
    print(f'\n{model}, {args.cpu_devices} CPU contexts, batch {SETTINGS[model][1]}, '
          f'median of {args.rounds}:', file=out)
    print('| K (steps in flight) | images/s | vs unbounded (95% interval) | verdict | '
          'peak memory MiB |', file=out)
    print('| ---: | ---: | ---: | --- | ---: |', file=out)
    rows, chosen = [], None
    for k, f in figures.items():
        speed, peak = statistics.median(f['speed']), statistics.median(f['peak'])
        against = versus(pairs, str(k), '0') if 0 in figures else None
        ratio = against['ratio'] if against else None
        shown = '' if ratio is None else f'{ratio:.3f}' + (
            f" ({against['low']:.3f}-{against['high']:.3f})"
            if against['low'] is not None and k else '')
        verdict = (against['verdict'] or '-') if against else '-'
        print(f'| {k or "unbounded"} | {speed:.1f} | {shown} | {verdict} | {peak:.0f} |', file=out)
        if k and ratio and ratio >= 1 - args.tolerance and (chosen is None or k < chosen):
            chosen = k
        rows.append({'model': model, 'k': k, 'images_per_sec': f['speed'],
                     'peak_rss_mib': f['peak'], 'ratio': ratio,
                     'ratio_low': against['low'] if against else None,
                     'ratio_high': against['high'] if against else None,
                     'verdict': against['verdict'] if against else None,
                     'load': f.get('load')})
    if chosen:
        print(f'smallest K within {args.tolerance:.0%} of unbounded: {chosen}', file=out)
    note = load_note(pairs.all_loads())
    if note:
        print(note[0].upper() + note[1:] + '.', file=out)
    return rows


def start(launcher=None):
    """The program: ``python scripts/inflight.py`` (``launcher``: its path)."""
    common.start(main, launcher, engine_argv=[])  # Ctrl-C while MXNet loads is one line


if __name__ == '__main__':
    start()

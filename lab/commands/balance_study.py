"""Measure even, weighted and auto splits of each batch on devices made unequal by other work.

Exercise 2 of d2l 13.6: what if the devices differ in speed? Here one
device also runs other work (matrix products queued on it one after another,
as a device shared with another job), which makes it slower than the others.
Scenarios: equal (no other work), busy (the last device busy throughout),
shift (the last device busy for the first half of the steps, then the first
device). For each, the same training steps run with --split even (the book),
fixed weights (--weights) and auto, taken in turn round after round; the
table gives images/s, each split's paired ratio to even with its interval
(``study.paired``), and each device's idle share: the part of a timed step
it waited for the slowest device.
"""
import os
import statistics
import sys

# What loads MXNet (or matplotlib) is imported where it is first used: after the engine
# settings (common.prepare_engine).  pylint: disable=import-outside-toplevel
from lab.commands import common
from lab.commands import sweeps
from lab.commands.common import batch_size, int_in, seed
from gluon_multigpu.filesafety.atomic import atomic_write
from gluon_multigpu.section.devices import num_gpus, resolve_devices, split_sizes
from gluon_multigpu.observe.hooks import Hook
from gluon_multigpu.errors import DeviceError, GluonMultiGPUError
from lab.studies import sweep as sweep_module
from lab.studies.budget import check_memory
from lab.studies.csvfiles import STAMP_COLUMNS, stamped, write_csv
from gluon_multigpu.filesafety.output import ReportSet
from gluon_multigpu.filesafety.targets import check_outputs

#: model -> (total batch, steps): a run of a few seconds (simple CNN) or half a minute.
SETTINGS = {'simple-cnn': (256, 80), 'resnet18': (64, 16)}
SCENARIOS = ('equal', 'busy', 'shift')
SPLITS = ('even', 'weights', 'auto')
#: The files of the report in --out: --results may not take their names.
REPORT_FILES = ('balance.csv', 'images.png', 'report.md')
#: Where the runs are kept as they end, without --out or --results.
RESULTS = 'balance-results.json'

EPILOG = """\
scenarios (the other work is N x N matrix products, --work-size, run beside the training):
  equal       no other work: the devices are alike
  busy        the other work on the last device for the whole run: it is the slow one
  shift       the other work on the last device, moved to the first halfway through the run:
              the slow device changes, and a split must follow it

figures:
  images/s    training images per second of the run's steps (synthetic data, one epoch, the
              first step's graph compilation included for every split alike)
  vs even     images/s / images/s of the even split in the same scenario and round: the
              median over the rounds, and its 95%% interval
  idle        per device, the share of the timed steps' time it waited for the slowest
              device (one step in --every is timed, for every split alike)
  shares      the split at the end of the run (auto: where it moved)
  auto changes (undone)
              times the auto split moved the shares, and (in brackets) how many of those moves
              it took back because the steps after it were not faster

examples:
  %(prog)s                                      2 CPU contexts, simple CNN, all scenarios
  %(prog)s --model resnet18 --scenarios busy --rounds 1 --out balance-resnet/
  %(prog)s --num-gpus 2 --weights 3,1

Bad input (devices that do not exist, weights that do not match the devices, an
output directory that cannot be written, missing data with --data-dir) stops
before any run with one line on stderr and exit status 2. After the first run a
line gives the estimate for all of them and faster alternatives; a line every
10 s names the run in progress. Each run is kept in --results as it ends
(marked partial until all are done): Ctrl-C, SIGTERM or SIGHUP is acknowledged
at once, stops after the current step, prints the partial table and says how to
continue (--resume), status 130, 143 or 129. The report folder is written at
the end, all or nothing; a disk that fills stops with one line naming the file
and status 1.
"""


def build_parser():
    """Return the argument parser of this script."""
    p = common.script_parser(__doc__, EPILOG, 'measure on gpu(0)..gpu(N-1)',
                           'measure on N CPU contexts (default: 2)')
    p.add_argument('--model', choices=list(SETTINGS), default='simple-cnn',
                   help='network (default: simple-cnn)')
    p.add_argument('--batch-size', type=batch_size, metavar='N',
                   help='total batch over all devices (default: 256 simple-cnn, 64 resnet18)')
    p.add_argument('--steps', type=int_in(4, 100_000), metavar='N',
                   help='training steps of each run (default: 80 simple-cnn, 16 resnet18)')
    p.add_argument('--weights', type=common.split_weights, metavar='W1,W2,...',
                   help='the fixed split measured, one weight per device (default: 2 for every '
                   'device but the last, 1 for the last: right for "busy")')
    p.add_argument('--scenarios', nargs='+', choices=SCENARIOS, default=list(SCENARIOS),
                   help='which to measure (default: all)')
    p.add_argument('--work-size', type=int_in(16, 8192), default=512, metavar='N',
                   help='the other work: N x N matrix products, one after another (default: 512)')
    p.add_argument('--rounds', type=int_in(1, 20), default=4, metavar='N',
                   help='measurements of each split, taken in turn; medians and paired ratios '
                   'are reported, round 1 left out of the ratios (default: 4)')
    p.add_argument('--every', type=int_in(1, 1000), default=5, metavar='N',
                   help='time one step in N for the idle shares (default: 5)')
    p.add_argument('--seed', type=seed, default=0, help='seed of weights and data (default: 0)')
    p.add_argument('--out', metavar='DIR',
                   help='write report.md, balance.csv and images.png into DIR, created if missing')
    common.add_data_flags(p, 'its training images feed the steps (without --data-dir or '
                          '--download the steps use random images of its shape; --download alone '
                          'uses ~/.mxnet/datasets/fashion-mnist)', default=False)
    common.add_sweep_flags(p, f'DIR/results.json with --out DIR, else {RESULTS}')
    return p


def _shift_work(work, device, at):
    """A hook that moves the other work to ``device`` after step ``at``."""
    class ShiftWork(Hook):
        def step_end(self, run, step, samples, timer):
            if step == at:
                work.move_to(device)
    return ShiftWork()


def make_split(name, weights, every):
    """The split measured under ``name``, timing one step in ``every``."""
    from gluon_multigpu.features.balance import AutoSplit, TimedSplit
    if name == 'auto':
        return AutoSplit(every=every)
    return TimedSplit(weights if name == 'weights' else None, every=every)


def run_once(args, scenario, split, devices, data, stop=None):
    """Train one epoch of ``data`` with ``split`` in ``scenario``; return images/s.

    ``stop`` (a ``StopRequest``) stops it after a step (``Interrupted``).
    """
    from gluon_multigpu.section.model import default_initializer, get_model
    from gluon_multigpu.machinery.training import train
    from gluon_multigpu.features.balance import make_split as split_hook
    from lab.studies.measure import OtherWork
    busy = devices[-1] if scenario in ('busy', 'shift') else None
    with OtherWork(busy, args.work_size) as work:
        hooks = [_shift_work(work, devices[0], len(data) // 2)] if scenario == 'shift' else []
        data.epoch = 0
        result = train(get_model(args.model), data, None, devices, num_epochs=1,
                       lr=0.05, seed=args.seed, initializer=default_initializer(args.model),
                       max_in_flight=1, progress_interval=0, hooks=[split_hook(split), *hooks,
                                                  *([stop] if stop is not None else [])])
    return result.samples_per_sec


def sizes(args):
    """``(batch, steps)`` of every run: the flags, or the model's ``SETTINGS``."""
    batch, steps = SETTINGS[args.model]
    return args.batch_size or batch, args.steps or steps


def make_data(args, devices):
    """The steps' data: Fashion-MNIST with --data-dir or --download, else random images."""
    from gluon_multigpu.section.data import load_data, synthetic_data
    batch, steps = sizes(args)
    if args.data_dir or args.download:
        sweeps.data_root(args)
        data, _ = load_data('fashion-mnist', batch, root=args.data_dir,
                            num_train=min(batch * steps, 60000), num_test=batch,
                            seed=args.seed, num_devices=len(devices))
        return data
    data, _ = synthetic_data('fashion-mnist', batch, num_train=batch * steps,
                             num_test=batch, seed=args.seed, num_devices=len(devices))
    return data


def result_check(num_devices):
    """Whether a result read back from --results is one ``measure_all`` keeps (``Sweep.check``)."""
    def ok(unit, r):  # pylint: disable=unused-argument
        numbers_ok = sweep_module.numbers_ok
        return isinstance(r, dict) and numbers_ok([r.get('speed')]) and r['speed'] > 0 and \
            numbers_ok(r.get('idle'), num_devices) and numbers_ok(r.get('shares'), num_devices) \
            and numbers_ok([r.get('changes'), r.get('undone')])
    return ok


def make_sweep(args, devices, say):
    """The units: every split in every scenario, ``args.rounds`` times in turn."""
    batch, steps = sizes(args)
    units = [sweep_module.Unit(f'{r + 1}/{scenario}/{name}',
                               f'round {r + 1}/{args.rounds}, {scenario}, split {name}: '
                               f'{steps} steps of {batch}', steps * batch)
             for r in range(args.rounds) for scenario in args.scenarios
             for name in (SPLITS if r % 2 == 0 else SPLITS[::-1])]  # ABC, CBA: no fixed order
    config = {'model': args.model, 'batch': batch, 'steps': steps, 'devices': len(devices),
              'device_type': devices[0].device_type, 'weights': args.weights,
              'scenarios': args.scenarios, 'work_size': args.work_size, 'every': args.every,
              'seed': args.seed, 'data': 'fashion-mnist' if args.data_dir or args.download
              else 'synthetic'}
    options = []
    if args.rounds > 1:
        options.append('--rounds 1')
    if len(args.scenarios) > 1:
        options.append('--scenarios busy')
    if steps > 20:
        options.append(f'--steps {max(20, args.every * 4)}')
    return sweep_module.Sweep(args.results or results_path(args), 'balance', config, units, say,
                              resume=args.resume, overwrite=args.overwrite, check=result_check(len(devices)),
                              advice=', '.join(options),
                              make_folder=args.out is not None and (
                                  args.results is None or
                                  sweeps.in_out_folder(args.results, args.out)))


def results_path(args):
    """The default results file: in --out, else balance-results.json."""
    return os.path.join(args.out, 'results.json') if args.out else RESULTS


def measure_all(args, devices, weights, say, stop=None, out=None):
    """Every scenario and split, ``args.rounds`` times in turn; return one row per pair.

    Each run is kept in the results file as it ends; a stop prints the rows measured so far.
    """
    batch, _ = sizes(args)
    data = make_data(args, devices)
    sweep = make_sweep(args, devices, say)

    def measure(unit):
        from gluon_multigpu.study.paired import LoadMeter
        _, scenario, name = unit.key.split('/')
        split = make_split(name, weights, args.every)
        meter = LoadMeter()
        meter.start()
        speed = run_once(args, scenario, split, devices, data, stop)
        load = meter.stop()
        say(f'  {unit.label}: {speed:.0f} images/s, {split.summary()}')
        return {'speed': speed, 'idle': list(split.idle()),
                'shares': split_sizes(batch, split.weights or [1.0] * len(devices)),
                'changes': getattr(split, 'changes', 0), 'undone': getattr(split, 'undone', 0),
                'load': load}

    def partial(results):
        print(sweeps.partial_heading(sweep), file=out or sys.stdout)
        print(table(summarise(results, len(devices)), [str(d) for d in devices]),
              file=out or sys.stdout, flush=True)
    return summarise(sweeps.measure_sweep(sweep, measure, stop, partial), len(devices)), batch


def summarise(results, num_devices):
    """One row per (scenario, split) measured: medians over its rounds, the paired ratio to even.

    ``vs_even`` is the median over the rounds of the split's images/s over
    even's in the same round, ``vs_even_low``/``vs_even_high`` its 95%
    interval (None with one round judged), ``verdict`` what that says
    (``faster``, ``slower``, ``equally fast``, ``cannot tell``; ``same split`` for an auto
    split that never moved the shares). ``loads``: every run's load.
    """
    from gluon_multigpu.study.paired import Paired
    from lab.studies.verdicts import versus
    runs = {}
    for unit, result in results:
        r, scenario, name = unit.key.split('/')
        runs.setdefault((scenario, name), []).append((int(r), result))
    pairs = {}
    for (scenario, name), measured in runs.items():
        pairs.setdefault(scenario, Paired(SPLITS, higher_is_better=True))
        for r, m in measured:
            pairs[scenario].add(name, r, m['speed'], m.get('load'))
    rows = []
    for (scenario, name), measured in runs.items():
        measured = [m for _, m in sorted(measured, key=lambda x: x[0])]
        speeds = [m['speed'] for m in measured]
        idle = [statistics.median(m['idle'][i] for m in measured) for i in range(num_devices)]
        last = measured[-1]
        row = {'scenario': scenario, 'split': name, 'images_per_sec': statistics.median(speeds),
               'idle': idle, 'shares': last['shares'], 'changes': last['changes'],
               'undone': last['undone'], 'rounds': speeds, 'vs_even': None,
               'vs_even_low': None, 'vs_even_high': None, 'verdict': None,
               'loads': [m.get('load') for m in measured]}
        if pairs[scenario].figures['even']:  # this split's images/s over even's, per round
            against = versus(pairs[scenario], name, 'even')
            same = name == 'auto' and all(m['changes'] == 0 for m in measured)
            row.update(vs_even=against['ratio'], vs_even_low=against['low'],
                       vs_even_high=against['high'],
                       # an auto split that never moved the shares ran the even split
                       verdict='same split' if same else against['verdict'])
        rows.append(row)
    order = {(s, n): i for i, (s, n) in enumerate((s, n) for s in SCENARIOS for n in SPLITS)}
    return sorted(rows, key=lambda r: order[r['scenario'], r['split']])


def table(rows, devices):
    """The Markdown table of ``rows``."""
    from gluon_multigpu.study.kvstore_report import markdown_table
    header = ['scenario', 'split', 'images/s', 'vs even (95% interval)'] + \
        [f'idle {d}' for d in devices] + ['shares (end)', 'auto changes (undone)']
    body = [[r['scenario'], r['split'], f"{r['images_per_sec']:.0f}", _vs_even(r),
             *(f'{100 * i:.0f}%' for i in r['idle']), '/'.join(map(str, r['shares'])),
             f"{r['changes']} ({r['undone']})" if r['split'] == 'auto' else '-'] for r in rows]
    return markdown_table(header, body, 'llrr' + 'r' * len(devices) + 'rr')


def _vs_even(row):
    """``1.21 (1.15-1.27)``, ``1.21`` with one round judged, ``-`` without even."""
    if row['vs_even'] is None:
        return '-'
    if row.get('vs_even_low') is None or row['split'] == 'even':
        return f"{row['vs_even']:.2f}"
    return f"{row['vs_even']:.2f} ({row['vs_even_low']:.2f}-{row['vs_even_high']:.2f})"


def answers(rows):
    """One line per scenario: whether balancing paid, each split against even with its
    interval; then the load during the runs."""
    from gluon_multigpu.study.paired import load_note
    lines = []
    for scenario in dict.fromkeys(r['scenario'] for r in rows):
        of = {r['split']: r for r in rows if r['scenario'] == scenario}
        if 'even' not in of:
            lines.append(f'{scenario}: the even split was not measured: nothing to compare with')
            continue
        judged = [r for n, r in of.items() if n != 'even']
        parts = []
        for r in judged:
            if r.get('verdict') == 'same split':
                parts.append(f"{r['split']} never moved the shares: the same split as even, "
                             'nothing to compare')
                continue
            interval = ('1 round judged: no interval' if r.get('vs_even_low') is None else
                        f"95% interval {r['vs_even_low']:.2f}-{r['vs_even_high']:.2f}")
            verdict = {'faster': 'faster than even', 'slower': 'slower than even',
                       'equally fast': 'as fast as even (the whole interval within 3%)'}.get(
                r.get('verdict'), 'cannot tell against even at this load (more rounds or a '
                                  'quieter machine would tell)')
            parts.append(f"{r['split']} {verdict} ({r['vs_even']:.2f}x even's images/s, "
                         f'{interval})')
        lines.append(f'{scenario}: ' + '; '.join(parts))
    note = load_note([l for r in rows for l in r.get('loads') or () if l])
    if note:
        lines.append(note[0].upper() + note[1:])
    return lines


def write_outputs(directory, rows, devices, config):
    """report.md, balance.csv and images.png in ``directory``, all or nothing (a ReportSet)."""
    from gluon_multigpu.study.charts import bar_chart
    flat = [dict({k: v for k, v in r.items() if k != 'loads'},
                 idle='/'.join(f'{i:.4f}' for i in r['idle']),
                 shares='/'.join(map(str, r['shares'])),
                 rounds='/'.join(f'{s:.1f}' for s in r['rounds'])) for r in rows]
    with ReportSet(directory) as folder:
        write_csv(folder.path('balance.csv'), stamped(flat),
                  ['scenario', 'split', 'images_per_sec', 'vs_even', 'vs_even_low',
                   'vs_even_high', 'verdict', 'idle', 'shares', 'changes', 'undone',
                   'rounds'] + STAMP_COLUMNS)
        bar_chart(folder.path('images.png'),
                  [f"{r['scenario']}\n{r['split']}" for r in rows],
                  [r['images_per_sec'] for r in rows], 'images/s',
                  title=f"{config['model']}, batch {config['batch']}, {len(devices)} devices",
                  figsize=(1.1 * len(rows) + 1, 3.8), fmt='%.0f')
        with atomic_write(folder.path('report.md'), 'w') as f:
            f.write(f"# Splitting each batch among devices of different speed\n\n"
                    f"Command: `{config['command']}`\n\n{table(rows, devices)}\n\n"
                    + '\n'.join(f'- {line}' for line in answers(rows))
                    + '\n\n![images/s](images.png)\n')


def run(args, out=None, stop=None):
    """Check the input, measure (each run kept in --results), print the table and answers,
    write the outputs. ``stop``: a ``StopRequest``."""
    from gluon_multigpu.section.model import memory_needed
    out = out or sys.stdout
    cpu_devices = args.cpu_devices
    if cpu_devices is None and args.num_gpus is None and not num_gpus():
        cpu_devices = 2  # the default without GPUs
    devices, _ = resolve_devices(args.num_gpus, cpu_devices)
    if len(devices) < 2:
        raise DeviceError('unequal devices need at least 2; use --cpu-devices 2 or more')
    weights = args.weights if isinstance(args.weights, list) else [2.0] * (len(devices) - 1) + [1]
    if len(weights) != len(devices):
        raise DeviceError(f'--weights gives {len(weights)} weights for {len(devices)} devices; '
                          'give one weight per device')
    batch, steps = sizes(args)
    if args.every > steps:  # no step of the even split would be timed: no idle shares
        raise GluonMultiGPUError(f'--every {args.every} times one step in {args.every}, and a '
                                 f'run has {steps} steps; give --every {steps} or less, or '
                                 'more --steps')
    if devices[0].device_type == 'cpu':
        check_memory(
            memory_needed(args.model, batch, len(devices)), sweeps.available_memory(),
            f'{args.model} with a batch of {batch} on {len(devices)} CPU contexts',
            'use a smaller --batch-size')
    check_outputs(files=sweeps.results_output(args.results, args.out, REPORT_FILES),
                  directories=[('--out', args.out)])
    rows, batch = measure_all(args, devices, weights, common.say_quietly, stop, out)
    print(table(rows, devices), file=out)
    print('', *answers(rows), file=out, sep='\n')
    if args.out:
        config = {'model': args.model, 'batch': batch,
                  'command': ' '.join([common.program('balance')] + sys.argv[1:])}
        write_outputs(args.out, rows, [str(d) for d in devices], config)
        print(f'\nwrote {os.path.join(args.out, "report.md")} and its files', file=out)
    return rows


def main(argv=None):
    """Run the script; return the exit status.

    0 when done; 1 when the report cannot be written (a disk that fills); 2
    for bad input; 128 + the signal (130 for Ctrl-C) when stopped by a signal.
    """
    return sweeps.sweep_main(argv, build_parser, run, 'balance')


def start(launcher=None):
    """The program: ``python scripts/balance.py`` (``launcher``: its path).

    Before MXNet loads (it reads OMP_NUM_THREADS once): without device flags
    and GPUs, this program measures 2 CPU contexts, and the engine is set up
    for them. A --cpu-devices of the command line comes later and wins
    (--cpu-devices=3 too).
    """
    argv = sys.argv[1:]
    common.start(main, launcher, engine_argv=['--cpu-devices', '2'] + argv
                 if common.engine_devices(argv) == 1 else argv)


if __name__ == '__main__':
    start()

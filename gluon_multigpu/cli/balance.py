"""Measure even, weighted and auto splits of each batch on devices made unequal by other work.

Exercise 2 of d2l 13.6: what if the devices differ in speed? Here one
device also runs other work (matrix products queued on it one after another,
as a device shared with another job), which makes it slower than the others.
Scenarios: equal (no other work), busy (the last device busy throughout),
shift (the last device busy for the first half of the steps, then the first
device). For each, the same training steps run with --split even (the book),
fixed weights (--weights) and auto, taken in turn, round after round; the
table gives images/s, the ratio to even, and each device's idle share: the
part of a timed step it waited for the slowest device.
"""
import os
import statistics
import sys

import gluon_multigpu as gm  # loads MXNet only when a name needs it: after the engine settings
from . import common
from .common import batch_size, int_in, seed, stopping_main

#: model -> (total batch, steps): a run of a few seconds (simple CNN) or half a minute.
SETTINGS = {'simple-cnn': (256, 80), 'resnet18': (64, 16)}
SCENARIOS = ('equal', 'busy', 'shift')
SPLITS = ('even', 'weights', 'auto')

EPILOG = """\
figures:
  images/s    training images per second of the run's steps (synthetic data, one epoch, the
              first step's graph compilation included for every split alike)
  vs even     images/s / images/s of the even split in the same scenario
  idle        per device, the share of the timed steps' time it waited for the slowest
              device (one step in --every is timed, for every split alike)
  shares      the split at the end of the run (auto: where it moved)

examples:
  %(prog)s                                      2 CPU contexts, simple CNN, all scenarios
  %(prog)s --model resnet18 --scenarios busy --rounds 1 --out balance-resnet/
  %(prog)s --num-gpus 2 --weights 3,1

Bad input (devices that do not exist, weights that do not match the devices, an
output directory that cannot be written) stops before any run with one line on
stderr and exit status 2. The output directory is written at the end, all or
nothing: Ctrl-C or SIGTERM stops with one line and status 130 or 143, a disk
that fills with one line naming the file and status 1, and either leaves it
as it was.
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
    p.add_argument('--rounds', type=int_in(1, 20), default=2, metavar='N',
                   help='measurements of each split; medians are reported (default: 2)')
    p.add_argument('--every', type=int_in(1, 1000), default=5, metavar='N',
                   help='time one step in N for the idle shares (default: 5)')
    p.add_argument('--seed', type=seed, default=0, help='seed of weights and data (default: 0)')
    p.add_argument('--out', metavar='DIR',
                   help='write report.md, balance.csv and images.png into DIR, created if missing')
    return p


def _shift_work(work, device, at):
    """A hook that moves the other work to ``device`` after step ``at``."""
    class ShiftWork(gm.Hook):
        def step_end(self, run, step, samples, timer):
            if step == at:
                work.move_to(device)
    return ShiftWork()


def make_split(name, weights, every):
    """The split measured under ``name``, timing one step in ``every``."""
    if name == 'auto':
        return gm.balance.AutoSplit(every=every)
    return gm.balance.TimedSplit(weights if name == 'weights' else None, every=every)


def run_once(args, scenario, split, devices, data):
    """Train one epoch of ``data`` with ``split`` in ``scenario``; return images/s."""
    busy = devices[-1] if scenario in ('busy', 'shift') else None
    with gm.measure.OtherWork(busy, args.work_size) as work:
        hooks = [_shift_work(work, devices[0], len(data) // 2)] if scenario == 'shift' else []
        data.epoch = 0
        result = gm.train(gm.get_model(args.model), data, None, devices, num_epochs=1,
                          lr=0.05, seed=args.seed, initializer=gm.default_initializer(args.model),
                          max_in_flight=1, hooks=[gm.balance.make_split(split), *hooks])
    return result.samples_per_sec


def measure_all(args, devices, weights, say):
    """Every scenario and split, ``args.rounds`` times in turn; return one row per pair."""
    batch, steps = SETTINGS[args.model]
    batch, steps = args.batch_size or batch, args.steps or steps
    data, _ = gm.data.synthetic_data('fashion-mnist', batch, num_train=batch * steps,
                                     num_test=batch, seed=args.seed, num_devices=len(devices))
    runs = {(s, n): [] for s in args.scenarios for n in SPLITS}
    for r in range(args.rounds):
        for scenario in args.scenarios:
            for name in SPLITS:
                split = make_split(name, weights, args.every)
                speed = run_once(args, scenario, split, devices, data)
                runs[scenario, name].append((speed, split))
                say(f'round {r + 1}/{args.rounds}, {scenario}, {name}: {speed:.0f} images/s, '
                    f'{split.summary()}')
    rows = []
    for (scenario, name), measured in runs.items():
        speeds = [m[0] for m in measured]
        idle = [statistics.median(m[1].idle()[i] for m in measured) for i in range(len(devices))]
        last = measured[-1][1]
        rows.append({'scenario': scenario, 'split': name, 'images_per_sec': statistics.median(speeds),
                     'idle': idle, 'shares': last.shares(batch, len(devices)),
                     'changes': getattr(last, 'changes', 0), 'undone': getattr(last, 'undone', 0),
                     'rounds': speeds})
    for row in rows:
        even = next(r for r in rows if r['scenario'] == row['scenario'] and r['split'] == 'even')
        row['vs_even'] = row['images_per_sec'] / even['images_per_sec']
    return rows, batch


def table(rows, devices):
    """The Markdown table of ``rows``."""
    header = ['scenario', 'split', 'images/s', 'vs even'] + [f'idle {d}' for d in devices] + \
        ['shares (end)', 'auto changes (undone)']
    body = [[r['scenario'], r['split'], f"{r['images_per_sec']:.0f}", f"{r['vs_even']:.2f}",
             *(f'{100 * i:.0f}%' for i in r['idle']), '/'.join(map(str, r['shares'])),
             f"{r['changes']} ({r['undone']})" if r['split'] == 'auto' else '-'] for r in rows]
    return gm.kvstore_report.markdown_table(header, body, 'llrr' + 'r' * len(devices) + 'rr')


def answers(rows):
    """One line per scenario: whether balancing paid, with the ratios measured."""
    lines = []
    for scenario in dict.fromkeys(r['scenario'] for r in rows):
        of = {r['split']: r for r in rows if r['scenario'] == scenario}
        best = max(of.values(), key=lambda r: r['images_per_sec'])
        lines.append(f"{scenario}: auto {of['auto']['vs_even']:.2f}x and weights "
                     f"{of['weights']['vs_even']:.2f}x the even split's images/s; fastest: "
                     f"{best['split']}")
    return lines


def write_outputs(directory, rows, devices, config):
    """report.md, balance.csv and images.png in ``directory``, all or nothing (a ReportFolder)."""
    flat = [dict(r, idle='/'.join(f'{i:.4f}' for i in r['idle']),
                 shares='/'.join(map(str, r['shares'])),
                 rounds='/'.join(f'{s:.1f}' for s in r['rounds'])) for r in rows]
    with gm.files.ReportFolder(directory) as folder:
        gm.files.write_csv(folder.path('balance.csv'), flat,
                           ['scenario', 'split', 'images_per_sec', 'vs_even', 'idle', 'shares',
                            'changes', 'undone', 'rounds'])
        gm.bar_chart(folder.path('images.png'),
                  [f"{r['scenario']}\n{r['split']}" for r in rows],
                  [r['images_per_sec'] for r in rows], 'images/s',
                  title=f"{config['model']}, batch {config['batch']}, {len(devices)} devices",
                  figsize=(1.1 * len(rows) + 1, 3.8), fmt='%.0f')
        with gm.files.atomic_write(folder.path('report.md'), 'w') as f:
            f.write(f"# Splitting each batch among devices of different speed\n\n"
                    f"Command: `{config['command']}`\n\n{table(rows, devices)}\n\n"
                    + '\n'.join(f'- {line}' for line in answers(rows))
                    + '\n\n![images/s](images.png)\n')


def run(args, out=None):
    """Check the input, measure, print the table and answers, write the outputs."""
    out = out or sys.stdout
    cpu_devices = args.cpu_devices
    if cpu_devices is None and args.num_gpus is None and not gm.num_gpus():
        cpu_devices = 2  # the default without GPUs
    devices, _ = gm.devices.resolve_devices(args.num_gpus, cpu_devices)
    if len(devices) < 2:
        raise gm.DeviceError('unequal devices need at least 2; use --cpu-devices 2 or more')
    weights = args.weights if isinstance(args.weights, list) else [2.0] * (len(devices) - 1) + [1]
    if len(weights) != len(devices):
        raise gm.DeviceError(f'--weights gives {len(weights)} weights for {len(devices)} devices; '
                             'give one weight per device')
    steps = args.steps or SETTINGS[args.model][1]
    if args.every > steps:  # no step of the even split would be timed: no idle shares
        raise gm.GluonMultiGPUError(f'--every {args.every} times one step in {args.every}, and a '
                                    f'run has {steps} steps; give --every {steps} or less, or '
                                    'more --steps')
    gm.files.check_outputs(directories=[('--out', args.out)])
    rows, batch = measure_all(args, devices, weights,
                              lambda line: print(line, file=sys.stderr, flush=True))
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
    for bad input; 130 or 143 when stopped by SIGINT or SIGTERM.
    """
    return stopping_main(argv, build_parser, run)


def start(launcher=None):
    """The program: ``gluon-multigpu-balance``, or ``scripts/balance.py`` (``launcher``).

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

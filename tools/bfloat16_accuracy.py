"""Train in float32 and in bfloat16 from the same seed, each epoch's test accuracy side by side.

A maintainer's tool, not part of the package (issue 54's accuracy check). For each job it runs
this checkout's ``scripts/train.py`` twice on two CPU contexts, float32 then ``--dtype
bfloat16``, with the same settings and seed, and records every epoch of both, the largest gap in
test accuracy against the job's bound, the machine and the commit:

    python tools/bfloat16_accuracy.py --data-dir ../shared/data/fashion-mnist \\
        --out docs/results/bfloat16-accuracy.json

The jobs: ResNet-18 on the whole of Fashion-MNIST for 3 epochs (bound 0.02; over an hour of
two cores with bfloat16 kernels) and the main job, the simple CNN for 2 epochs (bound 0.01).
ResNet-18 trains from 0.005 for batch 512 (``--lr``; a fortieth of the book's 0.2) falling
along a half cosine to 0 over the 3 epochs. At higher rates the test accuracy of the weights at
an epoch's end, read with BatchNorm's running statistics, swings between epochs and between
runs in float32 alone by more than the bound (0.86 then 0.79 at a constant 0.05; 0.81 then 0.59
at the book's 0.2; after the first epoch from 0.02, 0.60 in float32 and 0.34 in bfloat16, both
training at 0.72): docs/exercises.md has the records.
The record keeps each epoch's training loss and
accuracy beside the test accuracy: those average over the epoch and show how closely the two
train (docs/exercises.md has the table).
Each run's progress and epoch lines pass through as train.py prints them.
On a CPU without bfloat16 kernels it stops before training, in one line (status 2).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.base.machine import stamp  # noqa: E402
from gluon_multigpu.filesafety.files import write_json  # noqa: E402

#: job -> (train.py's flags, the largest test-accuracy gap allowed in any epoch)
JOBS = {'resnet18': (['--model', 'resnet18', '--num-epochs', '3', '--lr-schedule', 'cosine'],
                     0.02),
        'simple-cnn': (['--model', 'simple-cnn', '--num-epochs', '2'], 0.01)}
DTYPES = ('float32', 'bfloat16')
#: ResNet-18's rate for batch 512 at its start (a fortieth of the book's 0.2), along a half cosine to 0
RESNET18_LR = 0.005


def train(flags, dtype, data_dir, extra):
    """One run of scripts/train.py, its output passed through; its epochs (``--json``'s), or
    its exit status where it failed (it has said why)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'run.json')
        proc = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'train.py'),
                               '--cpu-devices', '2', *flags, '--dtype', dtype, '--data-dir',
                               data_dir, *extra, '--json', out], check=False)
        if proc.returncode:
            raise SystemExit(proc.returncode)
        with open(out, encoding='utf-8') as f:
            return json.load(f)['runs'][0]['epochs']


def commit():
    """This checkout's commit, with ``+changes`` where its tracked files differ from it."""
    def git(*args):
        return subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    return git('rev-parse', 'HEAD') + ('+changes' if git('status', '--porcelain',
                                                          '--untracked-files=no') else '')


def compare(name, runs, bound):
    """The job's record: both runs' epochs, each epoch's gap in test accuracy, whether within."""
    gaps = [abs(a['test_acc'] - b['test_acc']) for a, b in zip(*(runs[d] for d in DTYPES))]
    return {'job': name, 'bound': bound, 'gaps': gaps, 'within': max(gaps) <= bound,
            **{d: runs[d] for d in DTYPES}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--data-dir', default=os.path.join(ROOT, '..', 'shared', 'data',
                                                      'fashion-mnist'))
    p.add_argument('--jobs', nargs='+', choices=list(JOBS), default=list(JOBS))
    p.add_argument('--out', help='write the records, stamped, to this JSON file')
    p.add_argument('--lr', type=float, default=RESNET18_LR,
                   help="ResNet-18's rate at its start, falling to 0 (default: %(default)s)")
    p.add_argument('--num-train', type=int, help="fewer training images (a check of the tool's "
                   'plumbing, not of the accuracy)')
    args = p.parse_args(argv)
    extra = ['--num-train', str(args.num_train)] if args.num_train else []
    from gluon_multigpu.errors import GluonMultiGPUError, flag  # noqa: E402
    from gluon_multigpu.features import precision  # noqa: E402  (loads MXNet: after the flags)
    try:  # before the first float32 run: a CPU without bfloat16 kernels is told at once
        precision.check_bfloat16()
    except GluonMultiGPUError as e:
        print(f'error: {e.describe(flag)}', file=sys.stderr)
        return 2
    records = []
    for name in args.jobs:
        flags, bound = JOBS[name]
        flags = flags + (['--lr', str(args.lr)] if name == 'resnet18' else [])
        runs = {d: train(flags, d, args.data_dir, extra) for d in DTYPES}
        records.append(compare(name, runs, bound))
        r = records[-1]
        accs = {d: ' '.join(f"{e['test_acc']:.4f}" for e in r[d]) for d in DTYPES}
        print(f"{name}: test acc float32 {accs['float32']}; bfloat16 {accs['bfloat16']}; "
              f"largest gap {max(r['gaps']):.4f} (bound {bound}): "
              f"{'within' if r['within'] else 'NOT within'}", flush=True)
    if args.out:
        write_json(args.out, {'records': records, 'commit': commit(), 'resnet18_lr': args.lr,
                              'num_train': args.num_train, **stamp()})
    return 0 if all(r['within'] for r in records) else 1


if __name__ == '__main__':
    sys.exit(main())

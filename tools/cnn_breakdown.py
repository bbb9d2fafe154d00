"""Where the small CNN's training step goes, ours on two contexts against PyTorch on the same cores.

A maintainer's tool, not part of the package. Batch 128 of Fashion-MNIST
test images; each system in a fresh process (ours: two CPU contexts, a
thread each, as ``train`` runs; PyTorch: eager, every core), the processes
alternated. Inside a process each part is timed over ``--steps`` steps,
each step waited for, the parts alternated over the rounds:

- ``forward``: the forward pass and the loss;
- ``forward_backward``: the same recorded, and the backward pass;
- ``step``: a whole training step (forward, backward, the gradient sum and
  the update: ``steps.train_batch``; PyTorch's ``zero_grad``, backward, ``SGD``);
- ``tiny_...``: each of them on one image a context (two for PyTorch),
  whose compute is next to nothing: what a part costs besides computing
  (Python, queueing the operators, the hand-offs between threads).

    python tools/cnn_breakdown.py --data-dir ../shared/data/fashion-mnist
    # writes docs/results/cnn-breakdown.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402

#: Each part at batch 128, and at one image a context (``tiny_``)
PARTS = ('forward', 'forward_backward', 'step', 'tiny_forward', 'tiny_forward_backward',
         'tiny_step')
BATCH, LR = 128, 0.1


def _timed(run, batches):
    """Median milliseconds of ``run(batch)`` over ``batches`` (each call waits for its step)."""
    times = []
    for batch in batches:
        tic = time.perf_counter()
        run(batch)
        times.append((time.perf_counter() - tic) * 1000)
    return statistics.median(times)


def ours(spec):
    """Per-step milliseconds of each part, ours on two CPU contexts."""
    from gluon_multigpu.base import engine
    engine.configure(cpu_devices=2)
    import functools
    from mxnet import autograd, gluon, npx, np
    from lab.commands.bench_workers import _test_images
    from gluon_multigpu.section import steps
    from gluon_multigpu.section.devices import cpu_devices, split_batch
    from gluon_multigpu.section.kvstores import make_trainer
    from gluon_multigpu.section.model import default_initializer, get_model
    from gluon_multigpu.machinery.pushers import pushers_for
    devices = cpu_devices(2)
    images, labels = _test_images(spec, BATCH * spec['steps'])
    X = np.array(images[:, None].astype('float32') / 255)
    y = np.array(labels)
    net = get_model('simple-cnn', 10)
    net.initialize(default_initializer('simple-cnn'), ctx=devices)
    steps.hybridize(net)
    trainer = make_trainer(net, LR, 'device')
    loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def forward(X_shard, y_shard):
        return loss(net(X_shard), y_shard)

    def forward_backward(X_shard, y_shard):
        with autograd.record():
            l = loss(net(X_shard), y_shard)
        l.backward()
        return l

    with pushers_for(devices) as pushers:
        def per_shard(fn):
            def run(batch):
                shards = split_batch(*batch, devices)
                pushers.run([functools.partial(fn, *s) for s in zip(*shards)], 'train')
                npx.waitall()
            return run

        def step(batch):
            steps.train_batch(net, *batch, loss, trainer, devices, pushers=pushers)
            npx.waitall()
        runs = {'forward': per_shard(forward), 'forward_backward': per_shard(forward_backward),
                'step': step}
        return _rounds(spec, dict(runs, **{'tiny_' + k: v for k, v in runs.items()}), X, y)


def pytorch(spec):
    """Per-step milliseconds of each part, PyTorch eager on every core."""
    import torch
    from torch import nn
    from lab.commands.bench_workers import _test_images, _torch_simple_cnn
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    images, labels = _test_images(spec, BATCH * spec['steps'])
    X = torch.tensor(images[:, None] / 255.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    net, loss = _torch_simple_cnn(nn), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(net.parameters(), lr=LR)

    def forward(batch):
        with torch.no_grad():
            loss(net(batch[0]), batch[1])

    def forward_backward(batch):
        net.zero_grad()
        loss(net(batch[0]), batch[1]).backward()

    def step(batch):
        opt.zero_grad()
        loss(net(batch[0]), batch[1]).backward()
        opt.step()
    runs = {'forward': forward, 'forward_backward': forward_backward, 'step': step}
    runs.update({'tiny_' + k: v for k, v in runs.items()})
    return dict(_rounds(spec, runs, X, y), version=torch.__version__)


def _rounds(spec, runs, X, y):
    """Each part timed once a round (after one warm-up pass of each), medians over the rounds."""
    n = spec['steps']
    batches = [(X[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(n)]
    tiny = [(X[i * 2:(i + 1) * 2], y[i * 2:(i + 1) * 2]) for i in range(n)]
    data = {part: tiny if part.startswith('tiny_') else batches for part in PARTS}
    for part in PARTS:
        _timed(runs[part], data[part][:3])
    times = {part: [] for part in PARTS}
    for _ in range(spec['rounds']):
        for part in PARTS:
            times[part].append(_timed(runs[part], data[part]))
    return {part: statistics.median(t) for part, t in times.items()}


def measure(system, spec):
    """One fresh process of ``system``; its figures, or why it failed."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, __file__, '--worker', system, json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[7:])
    return {'error': (proc.stderr.strip().splitlines() or ['no output'])[-1]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--data-dir', default='../shared/data/fashion-mnist')
    parser.add_argument('--processes', type=int, default=2, help='fresh processes per system')
    parser.add_argument('--rounds', type=int, default=5, help='rounds within a process')
    parser.add_argument('--steps', type=int, default=30, help='timed steps per part and round')
    parser.add_argument('--out', default=os.path.join(ROOT, 'docs', 'results',
                                                      'cnn-breakdown.json'))
    parser.add_argument('--worker', nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        system, spec = args.worker[0], json.loads(args.worker[1])
        print('RESULT ' + json.dumps((ours if system == 'ours' else pytorch)(spec)), flush=True)
        return 0
    spec = {'data_dir': os.path.abspath(args.data_dir), 'rounds': args.rounds,
            'steps': args.steps}
    runs = {'ours': [], 'pytorch': []}
    for p in range(args.processes):
        for system in (('ours', 'pytorch') if p % 2 == 0 else ('pytorch', 'ours')):
            runs[system].append(measure(system, spec))
            print(f'[process {p + 1}/{args.processes}] {system}: {runs[system][-1]}', flush=True)
    rows = {s: {part: statistics.median(r[part] for r in rs if part in r) for part in PARTS}
            for s, rs in runs.items()}
    result = dict(stamp(), batch=BATCH, steps=args.steps, rounds=args.rounds,
                  processes=args.processes, ms_per_step=rows, runs=runs)
    with atomic_write(args.out) as f:
        f.write(json.dumps(result, indent=1) + '\n')
    print(f"{'part (ms a step)':18} {'ours':>8} {'pytorch':>8}")
    for part in PARTS:
        print(f"{part:18} {rows['ours'][part]:8.2f} {rows['pytorch'][part]:8.2f}")
    return 0


if __name__ == '__main__':
    sys.exit(main())

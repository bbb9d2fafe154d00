"""Where a ResNet-18 training step's time goes, ours against PyTorch's, operator by operator.

A maintainer's tool, not part of the package (issue 54 item 2: the profile of a bfloat16 step
against PyTorch's). Batch 128 of Fashion-MNIST test images, each system in a fresh
process, the same steps profiled in each after the same warm-up:

- ours: ``gm.train`` on two CPU contexts (a thread each, 64 images a context), ``--dtype``
  DTYPE, with ``--profile`` over the steps (MXNet's profiler; the package's trace). Each
  context's operators run on its own core at once, so an operator's time is given per
  context: the two contexts' total over two.
- PyTorch: eager, its threads on both cores, under ``torch.autocast`` for bfloat16,
  ``torch.profiler`` over the same number of steps; an operator's self time.

Both are in milliseconds a step, grouped by what the operators do (``GROUPS``; the
costliest of each group are kept), beside the step's wall time with the profiler on.

    python tools/step_profile.py --dtype bfloat16 --data-dir ../shared/data/fashion-mnist
    # writes docs/results/step-profile-bfloat16.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.base.machine import stamp  # noqa: E402
from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402

BATCH, LR, WARMUP = 128, 0.1, 3

#: What the operators do, by their names in MXNet's and PyTorch's profiles; the first that
#: matches takes the operator (case-sensitive). ``autograd``: PyTorch's autograd engine's own
#: records; ``relu_sums``: ReLU, the residual sums and their backward; ``update``: the
#: optimizer, the gradients' sum across contexts (``ElementwiseSum``) and copies; ``head``:
#: pooling, the dense layer, the loss.
GROUPS = (
    ('autograd', r'^autograd::|Backward0$'),
    ('convolution_backward', r'_backward_Convolution|convolution_backward'),
    ('convolution', r'Convolution|convolution'),
    ('batchnorm_backward', r'_backward_BatchNorm|batch_norm_backward'),
    ('batchnorm', r'BatchNorm|batch_norm'),
    ('casts', r'amp_cast|amp_multicast|^aten::to$|_to_copy|^aten::copy_$'),
    ('relu_sums', r'Activation|relu|clamp_min|threshold_backward|elemwise_add|_npi_add|'
                  r'^aten::add$|_backward_add|^add_n$'),
    ('update', r'sgd|update|Optimizer|_foreach|^aten::add_$|^aten::zero_$|CopyCPU2CPU|'
               r'ElementwiseSum|KVStore|^aten::fill_$'),
    ('head', r'Pool|pool|FullyConnected|addmm|^aten::mm$|linear|softmax|cross_entropy|'
             r'nll_loss|pick|log_|mean'),
)


def group_of(name):
    """The ``GROUPS`` name of operator ``name``, or 'other'."""
    return next((group for group, pattern in GROUPS if re.search(pattern, name)), 'other')


def grouped(ops, per_step):
    """``{group: {'ms': per step, 'ops': [(name, calls a step, ms a step)] costliest first}}``
    from ``ops`` ``{name: (calls, total ms)}`` over ``per_step`` (the divisor)."""
    groups = {}
    for name, (calls, ms) in sorted(ops.items(), key=lambda item: -item[1][1]):
        entry = groups.setdefault(group_of(name), {'ms': 0.0, 'ops': []})
        entry['ms'] += ms / per_step
        entry['ops'].append((name, calls / per_step, ms / per_step))
    for entry in groups.values():
        entry['ops'] = entry['ops'][:6]
    return groups


def ours(spec):
    """Our operators' milliseconds a step, per context, and the profiled steps' wall time."""
    import gluon_multigpu as gm
    from gluon_multigpu.features.precision import MixedPrecision
    from gluon_multigpu.observe.profile import Profile
    from gluon_multigpu.observe.traces import costliest
    steps = spec['steps']
    devices = gm.cpu_devices(2)
    from gluon_multigpu.section.data import ArrayLoader
    from lab.commands.bench_workers import _test_images
    train_iter = ArrayLoader(*_test_images(spec, BATCH * (WARMUP + steps)), BATCH)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'trace.json')
        hooks = [Profile(f'{WARMUP + 1}:{WARMUP + steps}', path, out=sys.stderr)]
        if spec['dtype'] != 'float32':
            hooks.append(MixedPrecision(spec['dtype']))
        gm.train(gm.get_model('resnet18'), train_iter, None, devices, num_epochs=1, lr=LR,
                 kvstore='device', seed=0, progress_interval=0, hooks=hooks)
        with open(path) as f:
            trace = json.load(f)
    ops = {name: (calls, ms) for name, calls, ms, _ in costliest(trace, count=10 ** 6)}
    stamps = [e['ts'] + e.get('dur', 0) for e in trace['traceEvents'] if 'ts' in e]
    wall = (max(stamps) - min(stamps)) / 1000 / steps
    return {'groups': grouped(ops, steps * len(devices)), 'wall_ms': wall,
            'op_ms': sum(ms for _, ms in ops.values()) / steps / len(devices)}


def pytorch(spec):
    """PyTorch's operators' self milliseconds a step, and the profiled steps' wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from lab.commands.bench_workers import _torch_resnet18, _test_images
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    steps = spec['steps']
    images, labels = _test_images(spec, BATCH * (WARMUP + steps))
    X = torch.tensor(images[:, None] / 255.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    batches = list(zip(X.split(BATCH), y.split(BATCH)))
    net, loss = _torch_resnet18(torch.nn), torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(net.parameters(), lr=LR)

    def step(Xb, yb):
        opt.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=spec['dtype'] == 'bfloat16'):
            value = loss(net(Xb), yb)
        value.backward()
        opt.step()
    for Xb, yb in batches[:WARMUP]:
        step(Xb, yb)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tic = time.perf_counter()
        for Xb, yb in batches[WARMUP:]:
            step(Xb, yb)
        wall = (time.perf_counter() - tic) * 1000 / steps
    ops = {e.key: (e.count, e.self_cpu_time_total / 1000) for e in prof.key_averages()}
    return {'groups': grouped(ops, steps), 'wall_ms': wall,
            'op_ms': sum(ms for _, ms in ops.values()) / steps, 'version': torch.__version__}


def measure(system, spec):
    """One fresh process of ``system``; its figures, or why it failed."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, __file__, '--worker', system, json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=1800, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[7:])
    return {'error': (proc.stderr.strip().splitlines() or ['no output'])[-1]}


def table(results):
    """The groups' milliseconds a step side by side, as lines of text."""
    names = [g for g, _ in GROUPS] + ['other']
    lines = [f"{'ms a step (ours: per context)':34} {'ours':>8} {'pytorch':>8}"]
    for name in names:
        row = [results[s]['groups'].get(name, {}).get('ms', 0.0) for s in ('ours', 'pytorch')]
        lines.append(f'{name:34} {row[0]:8.1f} {row[1]:8.1f}')
    for key, label in (('op_ms', 'operators in all'), ('wall_ms', 'step, wall (profiling)')):
        lines.append(f"{label:34} {results['ours'][key]:8.1f} {results['pytorch'][key]:8.1f}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--dtype', choices=['float32', 'bfloat16'], default='bfloat16')
    parser.add_argument('--data-dir', default='../shared/data/fashion-mnist')
    parser.add_argument('--steps', type=int, default=5, help='profiled steps (after 3 warm-up)')
    parser.add_argument('--out', help='results file (default: '
                                      'docs/results/step-profile-DTYPE.json)')
    parser.add_argument('--worker', nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        system, spec = args.worker[0], json.loads(args.worker[1])
        print('RESULT ' + json.dumps((ours if system == 'ours' else pytorch)(spec)), flush=True)
        return 0
    spec = {'data_dir': os.path.abspath(args.data_dir), 'steps': args.steps, 'dtype': args.dtype}
    results = {system: measure(system, spec) for system in ('ours', 'pytorch')}
    for system, result in results.items():
        if 'error' in result:
            print(f'{system} failed: {result["error"]}', file=sys.stderr)
            return 2
    out = args.out or os.path.join(ROOT, 'docs', 'results', f'step-profile-{args.dtype}.json')
    with atomic_write(out) as f:
        f.write(json.dumps(dict(stamp(), dtype=args.dtype, batch=BATCH, steps=args.steps,
                                warmup=WARMUP, **results), indent=1) + '\n')
    print('\n'.join(table(results)))
    return 0


if __name__ == '__main__':
    sys.exit(main())

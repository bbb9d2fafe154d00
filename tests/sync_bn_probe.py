"""One training step with synchronised BatchNorm against one device on the whole batch.

Run as a process of its own (tests/training/test_sync_bn.py): a synchronisation that
went wrong would wait forever, and the test's deadline ends it. Prints JSON:
for 2-device SyncBatchNorm and, as the contrast, 2-device nn.BatchNorm: after
one step, the largest difference of the running statistics to the 1-device
run, and of any parameter update to the 1-device one (relative to the largest
update); after a second step, the largest difference of the running
statistics between the devices. (After the first step plain BatchNorm's agree
too: the Trainer copies device 0's values to the others at its first step.)

``python tests/sync_bn_probe.py DATA_DIR [FILE] [--dtype bfloat16]``: FILE also gets the JSON,
with this machine and the date (docs/results/sync-bn-probe.json, which docs/exercises.md
quotes). With ``--dtype bfloat16`` every run, the 1-device one too, trains the network's
bfloat16 graph (``precision.Bfloat16``) as ``--dtype bfloat16`` does.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as onp

import gluon_multigpu as gm  # loads no MXNet

gm.engine.configure(2, sync_bn=True)  # before MXNet loads

import mxnet as mx  # noqa: E402
from mxnet import gluon, init, np  # noqa: E402


def values(net, devices):
    return {n: [p.data(d).asnumpy() for d in devices]
            for n, p in net._collect_params_with_prefix().items()}


def steps(net, devices, batches, params_file, dtype):
    """Values before and after each step on ``batches``, from the parameters in ``params_file``,
    computing in ``dtype``."""
    net.initialize(init.Normal(0.01), ctx=devices)
    gm.training.hybridize(net)
    with mx.autograd.predict_mode():
        net(batches[0][0][:len(devices)].as_in_ctx(devices[0]))  # every parameter exists
    net.load_parameters(params_file, ctx=devices)
    trainer = gm.kvstores.make_trainer(net, 0.1, 'device')
    seen = [values(net, devices)]
    model = gm.precision.Bfloat16(net) if dtype == 'bfloat16' else net
    for X, y in batches:
        gm.train_batch(model, X, y, gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
        seen.append(values(net, devices))
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('data_dir')
    parser.add_argument('file', nargs='?')
    parser.add_argument('--dtype', choices=['float32', 'bfloat16'], default='float32')
    args = parser.parse_args()
    data_dir, dtype = args.data_dir, args.dtype
    images, labels = gm.read_split(data_dir, 'test', 'fashion-mnist')
    batches = [(np.array(images[i:i + 16, None] / 255.0, dtype='float32'),
                np.array(labels[i:i + 16], dtype='int32')) for i in (0, 16)]
    one = [mx.cpu(0)]
    two = gm.cpu_devices(2)
    with tempfile.TemporaryDirectory() as tmp:
        params_file = os.path.join(tmp, 'start.params')
        mx.random.seed(0)
        start = gm.resnet18(10)
        start.initialize(init.Normal(0.01), ctx=one)
        start(batches[0][0][:1])
        start.save_parameters(params_file)
        ref = steps(gm.resnet18(10), one, batches[:1], params_file, dtype)
        runs = {'sync': gm.resnet18(10, norm=gm.sync_bn.sync_batch_norm(2)),
                'plain': gm.resnet18(10)}
        out = {}
        for name, net in runs.items():
            seen = steps(net, two, batches, params_file, dtype)
            stats = [n for n in ref[0] if 'running' in n]
            weights = [n for n in ref[0] if 'running' not in n]
            largest = max(float(onp.abs(ref[1][n][0] - ref[0][n][0]).max()) for n in weights)
            out[name] = {
                'stats_vs_one_device': max(float(onp.abs(seen[1][n][i] - ref[1][n][0]).max())
                                           for n in stats for i in (0, 1)),
                'stats_max': max(float(onp.abs(ref[1][n][0]).max()) for n in stats),
                'update_vs_one_device': max(
                    float(onp.abs((seen[1][n][0] - seen[0][n][0]) - (ref[1][n][0] - ref[0][n][0]))
                          .max()) for n in weights) / largest,
                'stats_between_devices': max(float(onp.abs(seen[2][n][0] - seen[2][n][1]).max())
                                             for n in stats),
                'num_sync_layers': sum(isinstance(b, gm.sync_bn.SyncBatchNorm)
                                       for b in _blocks(net)),
            }
    print(json.dumps(out))
    if args.file:
        from gluon_multigpu.filesafety.atomic import atomic_write
        from gluon_multigpu.base.machine import stamp
        with atomic_write(args.file) as f:
            json.dump({**out, 'dtype': dtype, **stamp()}, f, indent=2)
            f.write('\n')


def _blocks(net):
    stack = [net]
    while stack:
        block = stack.pop()
        yield block
        stack.extend(block._children.values())


if __name__ == '__main__':
    main()

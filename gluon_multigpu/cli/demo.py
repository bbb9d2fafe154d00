"""Walk through d2l 13.6 on two devices, printing what the text prints.

1. The forward of 4 random observations split over two devices.
2. The first-layer weights, identical on both devices.
3. The "not initialized on cpu" check: the parameters exist only where they
   were initialised.

With two GPUs it uses gpu(0) and gpu(1), as the text. Otherwise it uses the
CPU contexts cpu(1) and cpu(2), so that cpu(0), MXNet's default context,
plays the part of "the CPU" on which nothing was initialised.
"""
from . import console
from .arguments import OneLineParser, seed
from ..section.devices import num_gpus


def build_parser():
    """Return the argument parser of this script."""
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument('--cpu', action='store_true',
                   help='use the CPU contexts cpu(1), cpu(2) even when two GPUs exist')
    p.add_argument('--seed', type=seed, help="seed MXNet's generators first (default: "
                   "MXNet's start-up state, which reproduces the weights printed in the text)")
    return p


def show(arr):
    """Return the text's repr of an array: the values and, always, its device."""
    return text if 'ctx=' in (text := repr(arr)) else f'{text[:-1]}, ctx={arr.ctx})'


def walk_through(devices, out=None):
    """Run the three steps of the text on ``devices``, printing to ``out`` (None: standard
    output); return the network."""
    from mxnet import gluon, init, np  # pylint: disable=import-outside-toplevel
    from ..section.book import resnet18  # pylint: disable=import-outside-toplevel
    net = resnet18(10)
    net.initialize(init=init.Normal(sigma=0.01), ctx=devices)
    print(f'devices = {devices}', file=out)

    print('\n>>> x = np.random.uniform(size=(4, 1, 28, 28))', file=out)
    print('>>> x_shards = gluon.utils.split_and_load(x, devices)', file=out)
    print('>>> net(x_shards[0]), net(x_shards[1])', file=out)
    x = np.random.uniform(size=(4, 1, 28, 28))
    x_shards = gluon.utils.split_and_load(x, devices)
    print(f'({show(net(x_shards[0]))},\n {show(net(x_shards[1]))})', file=out)

    print("\n>>> weight = net[0].params.get('weight')", file=out)
    print('>>> try: weight.data()  # on the default context, where nothing was initialised',
          file=out)
    print(">>> except RuntimeError: print('not initialized on cpu')", file=out)
    weight = net[0].params.get('weight')
    try:
        weight.data()
    except RuntimeError:
        print('not initialized on cpu', file=out)
    print('>>> weight.data(devices[0])[0], weight.data(devices[1])[0]', file=out)
    print(f'({show(weight.data(devices[0])[0])},\n {show(weight.data(devices[1])[0])})', file=out)
    return net


def run(args, out=None):
    """Run the walk-through on the devices ``args`` ask for (two GPUs, or cpu(1) and cpu(2));
    return the network."""
    import mxnet as mx  # pylint: disable=import-outside-toplevel  (after the engine settings)
    if args.seed is not None:
        mx.random.seed(args.seed)
    if not args.cpu and num_gpus() >= 2:
        return walk_through([mx.gpu(0), mx.gpu(1)], out)
    print('fewer than two GPUs (or --cpu): using CPU contexts cpu(1) and cpu(2); '
          'cpu(0), the default context, plays the CPU of the text', file=out)
    return walk_through([mx.cpu(1), mx.cpu(2)], out)


def main(argv=None):
    """Run the walk-through; return the exit status (0, 2 for bad input, 130 or 143 when
    stopped by SIGINT or SIGTERM)."""
    return console.stopping_main(argv, build_parser, run)


def start(launcher=None):
    """The program: ``gluon-multigpu-demo``, or ``scripts/demo.py`` (``launcher``)."""
    console.start(main, launcher)


if __name__ == '__main__':
    start()

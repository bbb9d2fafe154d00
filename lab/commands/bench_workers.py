"""The measurements of the benchmark program; each runs in a fresh process and returns a dict.

MXNet's engine settings are in the environment before this module imports
MXNet (the parent process sets them per variant), so nothing here imports
MXNet or the package at module level: each measurement imports what it uses.
"""
# pylint: disable=import-outside-toplevel
import contextlib
import gzip
import os
import resource
import struct
import time

#: The SGD learning rate of every training-speed measurement: ours, the book's and PyTorch's.
LR = 0.01


def _rss_mb():
    """Resident memory of this process now, in MiB."""
    with open('/proc/self/statm') as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf('SC_PAGE_SIZE') / 2**20


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _read_idx(path):
    """One gzip-compressed IDX file as a NumPy array, read without MXNet.

    The PyTorch process reads the images this way, so its peak memory holds
    no MXNet; the MXNet processes read them the same way, to hold the same.
    """
    import numpy as onp
    with gzip.open(path, 'rb') as f:
        zero, kind, ndim = struct.unpack('>HBB', f.read(4))
        if zero != 0 or kind != 0x08:
            raise ValueError(f'{path} is not an IDX file of bytes')
        shape = struct.unpack(f'>{ndim}I', f.read(4 * ndim))
        return onp.frombuffer(f.read(), dtype=onp.uint8).reshape(shape)


def _test_images(spec, n):
    """The first ``n`` test images (uint8) and labels (int32), repeated if there are fewer."""
    import numpy as onp
    images = _read_idx(os.path.join(spec['data_dir'], 't10k-images-idx3-ubyte.gz'))
    labels = _read_idx(os.path.join(spec['data_dir'], 't10k-labels-idx1-ubyte.gz'))
    labels = labels.astype(onp.int32)
    reps = -(-n // len(labels))
    if reps > 1:
        images, labels = onp.concatenate([images] * reps), onp.concatenate([labels] * reps)
    return images[:n], labels[:n]


def _net(variant, model):
    from gluon_multigpu.section import book
    from gluon_multigpu.section.model import resnet18, simple_cnn
    if model == 'resnet18':  # the text's nn.Block residuals, or the compilable ones
        return book.resnet18(10) if variant == 'book' else resnet18(10)
    return simple_cnn(10)


#: When this module was imported: a process's launch where its parent did not say (``launched``).
_IMPORTED = time.time()


def launched_at(spec):
    """The wall-clock time (``time.time()``) at which the parent started this process."""
    return spec.get('launched') or _IMPORTED


def _clocked(first_step, warmup_rest, measured, sync, images, launched, ready):
    """Run the three parts of a training-speed measurement; return its figures.

    ``launched``: the wall-clock time the process was started at (a user's
    run: the interpreter, the imports, reading the images, building the
    network all count). ``first_step``, ``warmup_rest`` and ``measured`` run
    the first warm-up step, the other warm-up steps and the measured steps,
    each returning its images; ``sync`` waits for every queued step.
    ``images``: those of all the steps. ``ready``: the wall-clock time just
    before the network was built (``ready_s`` after the launch: the imports
    and the images, what an earlier short run left out).
    """
    first_step()
    sync()
    first = time.time()
    warmup_rest()
    sync()  # the end of the warm-up: the steady-state clock starts here
    tic = time.perf_counter()
    steady = measured()
    sync()  # the final sync point: both clocks stop here
    end, end_wall = time.perf_counter(), time.time()
    return {'images_per_sec': steady / (end - tic),
            'short_images_per_sec': images / (end_wall - launched),
            'startup_s': first - launched, 'ready_s': ready - launched,
            'total_s': end_wall - launched, 'peak_mb': _peak_rss_mb()}


def throughput(spec):
    """Training images/s of one variant, the library's own epoch functions on real images.

    Steady state (``images_per_sec``): the steps after the warm-up. The short
    run (``short_images_per_sec``): every step's images over the process's
    whole time, from its launch (``launched_at``: the interpreter, importing
    MXNet, reading the images, building, initialising and compiling count, as
    in a user's run). ``startup_s``: the launch to the end of the first step;
    ``peak_mb``: the process's peak resident memory.
    """
    from mxnet import gluon, npx
    from gluon_multigpu.machinery import training
    from gluon_multigpu.section import book
    from gluon_multigpu.section.data import ArrayLoader
    from gluon_multigpu.section.devices import cpu_devices
    from gluon_multigpu.section.kvstores import make_trainer
    from gluon_multigpu.section.model import default_initializer
    from gluon_multigpu.machinery.pushers import pushers_for
    devices = cpu_devices(spec['devices'])
    batch, warmup, steps = spec['batch'], spec['warmup'], spec['steps']
    images, labels = _test_images(spec, batch * (warmup + steps))
    batches = list(ArrayLoader(images, labels, batch))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    ours = spec['variant'] == 'ours'
    npx.waitall()
    ready = time.time()
    net = _net(spec['variant'], spec['model'])
    net.initialize(default_initializer(spec['model']), ctx=devices)
    if ours:
        training.hybridize(net)
    model = net
    if spec.get('dtype') == 'bfloat16':  # what --dtype bfloat16 trains: the converted graph
        from gluon_multigpu.features.precision import Bfloat16
        model = Bfloat16(net)
    trainer = make_trainer(net, LR, spec['kvstore'])

    def run(data):  # queue the steps of ``data``; return their images
        if ours:  # each CPU context's passes from a thread of its own, as ``train`` does
            step = training.Step(model, loss, trainer, devices, pushers=pushers,
                                 max_in_flight=spec.get('max_in_flight', 1))
            return training.train_epoch(step, data).samples
        return book.train_epoch_book(net, data, loss, trainer, devices, batch)
    with (pushers_for(devices) if ours else contextlib.nullcontext()) as pushers:
        figures = _clocked(lambda: run(batches[:1]), lambda: run(batches[1:warmup]),
                           lambda: run(batches[warmup:]), npx.waitall, len(labels),
                           launched_at(spec), ready)
    figures['param_count'] = sum(int(p.data(devices[0]).size)
                                 for p in net.collect_params().values())
    return figures


def gemm(spec):
    """Dense matrix-multiply GFLOP/s on the contexts at once: oneDNN (FullyConnected) and np.dot."""
    import mxnet as mx
    from mxnet import np, npx
    n, reps = spec['n'], spec['reps']
    devices = [mx.cpu(i) for i in range(spec['devices'])]
    A = [np.random.uniform(size=(n, n), ctx=d) for d in devices]
    B = [np.random.uniform(size=(n, n), ctx=d) for d in devices]
    rates = {}
    for name, f in (('onednn', lambda a, b: npx.fully_connected(a, b, num_hidden=n, no_bias=True)),
                    ('np_dot', np.dot)):
        [f(a, b) for a, b in zip(A, B)]
        npx.waitall()
        tic = time.perf_counter()
        for _ in range(reps):
            [f(a, b) for a, b in zip(A, B)]
        npx.waitall()  # sync point: every product done before the clock stops
        rates[name] = 2 * n**3 * reps * len(devices) / (time.perf_counter() - tic) / 1e9
    return {'gflops': max(rates.values()), **{f'gflops_{k}': v for k, v in rates.items()}}


def _torch_resnet18(nn):
    """The PyTorch edition's ResNet-18 (seed 000), the same layers as the book's MXNet one."""
    F = nn.functional

    class Residual(nn.Module):
        def __init__(self, c_in, c, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c, 3, padding=1, stride=strides)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1)
            self.conv3 = nn.Conv2d(c_in, c, 1, stride=strides) if use_1x1conv else None
            self.bn1, self.bn2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)

        def forward(self, X):
            Y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(X)))))
            return F.relu(Y + (self.conv3(X) if self.conv3 is not None else X))

    def stage(c_in, c, first=False):
        return nn.Sequential(Residual(c_in, c, not first, 1 if first else 2), Residual(c, c))

    return nn.Sequential(nn.Conv2d(1, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(),
                         stage(64, 64, True), stage(64, 128), stage(128, 256), stage(256, 512),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))


def _torch_simple_cnn(nn, num_classes=10):
    """The PyTorch edition of ``model.simple_cnn``: the same layers, shapes and parameters.

    conv 20 3x3 relu, max-pool 2 stride 2, conv 50 5x5 relu, max-pool 2,
    flatten, dense 128 relu, dense ``num_classes`` (28x28 inputs: 50 x 4 x 4
    features reach the first dense layer).
    """
    return nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(50 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, num_classes))


#: The PyTorch networks by the package's model names; each takes ``torch.nn``.
TORCH_MODELS = {'resnet18': _torch_resnet18, 'simple-cnn': _torch_simple_cnn}


#: What a PyTorch measurement returns where PyTorch is not installed.
NO_TORCH = {'error': "PyTorch is not installed (pip install -e '.[bench]')", 'torch_missing': True}


def _torch():
    """PyTorch, its threads on every core this process may use (its own default), or None."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    return torch


def torch_throughput(spec):
    """PyTorch CPU (eager) training figures for the same model, batch, steps and learning rate.

    The same figures as ``throughput``, on every core this process may use
    (importing PyTorch, and the modules it loads with its first optimizer,
    count in the short run as MXNet's import does in ours); or why it could
    not run (``torch_missing``: PyTorch is not installed).
    """
    if (torch := _torch()) is None:
        return dict(NO_TORCH)
    nn = torch.nn
    torch.manual_seed(0)
    batch, warmup, steps = spec['batch'], spec['warmup'], spec['steps']
    images, labels = _test_images(spec, batch * (warmup + steps))
    X = torch.tensor(images[:, None] / 255.0, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    batches = list(zip(X.split(batch), y.split(batch)))
    loss = nn.CrossEntropyLoss()
    # PyTorch loads its compiler's modules when the first optimizer is made (a second or so):
    # importing, so before ``ready``, and inside the short run as every import is
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    ready = time.time()
    net = TORCH_MODELS[spec.get('model', 'resnet18')](nn)
    opt = torch.optim.SGD(net.parameters(), lr=LR)

    bfloat16, computed = spec.get('dtype') == 'bfloat16', set()

    def run(data):  # eager: each step is done when it returns
        for Xb, yb in data:
            opt.zero_grad()
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bfloat16):
                logits = net(Xb)
                value = loss(logits, yb)
            computed.add(str(logits.dtype).replace('torch.', ''))
            value.backward()
            opt.step()
        return sum(len(yb) for _, yb in data)
    figures = _clocked(lambda: run(batches[:1]), lambda: run(batches[1:warmup]),
                       lambda: run(batches[warmup:]), lambda: None, len(labels),
                       launched_at(spec), ready)
    return dict(figures, param_count=sum(p.numel() for p in net.parameters()),
                threads=torch.get_num_threads(), version=torch.__version__,
                computed=sorted(computed))  # the networks' outputs' dtype: autocast's or not


def torch_gemm(spec):
    """bfloat16 matrix-multiply GFLOP/s on every core, by PyTorch (oneDNN): the CPU's bfloat16
    rate as a library reaches it, against which ResNet-18's bfloat16 training is set."""
    if (torch := _torch()) is None:
        return dict(NO_TORCH)
    n, reps = spec['n'], spec['reps']
    a, b = (torch.rand(n, n).to(torch.bfloat16) for _ in range(2))
    torch.mm(a, b)
    tic = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return {'gflops': 2 * n**3 * reps / (time.perf_counter() - tic) / 1e9}


def book_loaders(images, labels, test_images, test_labels, batch, workers=4):
    """Loaders built the book's way: a Gluon DataLoader, ToTensor per sample, worker processes."""
    import mxnet as mx
    from mxnet import gluon
    trans = gluon.data.vision.transforms.ToTensor()

    def dataset(x, y):
        return gluon.data.ArrayDataset(mx.np.array(x[..., None], dtype='uint8'),
                                       mx.np.array(y, dtype='int32')).transform_first(trans)
    return (gluon.data.DataLoader(dataset(images, labels), batch, shuffle=True,
                                  num_workers=workers),
            gluon.data.DataLoader(dataset(test_images, test_labels), batch, shuffle=False,
                                  num_workers=workers))


def pipeline(spec):
    """Images/s delivered by a loader, each batch made ready (X.wait_to_read: a sync point)."""
    from gluon_multigpu.section.data import ArrayLoader, read_split
    images, labels = read_split(spec['data_dir'], 'train', 'fashion-mnist')
    images, labels = images[:spec['images']], labels[:spec['images']]
    if spec['variant'] == 'book':
        loader, _ = book_loaders(images, labels, images[:1], labels[:1], spec['batch'])
    else:
        loader = ArrayLoader(images, labels, spec['batch'], shuffle=True)
    tic, n = time.perf_counter(), 0
    for X, _ in loader:
        X.wait_to_read()
        n += X.shape[0]
    return {'images_per_sec': n / (time.perf_counter() - tic)}


def evaluation(spec):
    """Evaluation images/s of ResNet-18 over the test images: the book's function or ours."""
    from gluon_multigpu.machinery import training
    from gluon_multigpu.section.book import evaluate_accuracy_book
    from gluon_multigpu.section.data import ArrayLoader
    from gluon_multigpu.section.devices import cpu_devices
    from gluon_multigpu.section.model import default_initializer
    from gluon_multigpu.machinery.pushers import pushers_for
    from gluon_multigpu.section.steps import evaluate_accuracy_gpus
    devices = cpu_devices(spec['devices'])
    images, labels = _test_images(spec, spec['images'])
    loader = ArrayLoader(images, labels, spec['batch'])
    net = _net(spec['variant'], 'resnet18')
    net.initialize(default_initializer('resnet18'), ctx=devices)
    if spec['variant'] == 'ours':
        training.hybridize(net)

        def evaluate(net, data):
            return evaluate_accuracy_gpus(net, data, devices, pushers=pushers)
    else:
        evaluate = evaluate_accuracy_book
    with (pushers_for(devices) if spec['variant'] == 'ours' else contextlib.nullcontext()) \
            as pushers:
        evaluate(net, ArrayLoader(images[:spec['batch']], labels[:spec['batch']], spec['batch']))
        tic = time.perf_counter()
        evaluate(net, loader)
    return {'images_per_sec': len(labels) / (time.perf_counter() - tic)}


def _run_training(spec, on_epoch):
    """Train the simple CNN as the variant does; return the TrainResult."""
    from gluon_multigpu.section.book import train_book
    from gluon_multigpu.section.data import load_data_fashion_mnist, read_split
    from gluon_multigpu.section.devices import cpu_devices
    from gluon_multigpu.section.model import default_initializer, simple_cnn
    from gluon_multigpu.machinery.training import train
    devices = cpu_devices(spec['devices'])
    batch, lr = spec['batch'], 0.1 * spec['batch'] / 256
    init = default_initializer('simple-cnn')
    num_train, num_test = spec.get('num_train'), spec.get('num_test')
    if spec['variant'] == 'book':
        root = spec['data_dir']
        images, labels = read_split(root, 'train', 'fashion-mnist')
        test_images, test_labels = read_split(root, 'test', 'fashion-mnist')
        train_iter, test_iter = book_loaders(images[:num_train], labels[:num_train],
                                             test_images[:num_test], test_labels[:num_test],
                                             batch)
        return train_book(simple_cnn(), train_iter, test_iter, devices,
                          num_epochs=spec['epochs'], lr=lr, batch_size=batch, seed=0,
                          initializer=init, on_epoch=on_epoch)
    train_iter, test_iter = load_data_fashion_mnist(batch, root=spec['data_dir'],
                                                    num_train=num_train, num_test=num_test)
    return train(simple_cnn(), train_iter, test_iter, devices, num_epochs=spec['epochs'],
                 lr=lr, seed=0, initializer=init, on_epoch=on_epoch, max_in_flight=1,
                 progress_interval=0)


def end_to_end(spec):
    """Whole epochs of the simple CNN on the real data: wall time (train + test) and accuracy."""
    walls = []
    result = _run_training(spec, lambda r: walls.append(r.seconds + r.eval_seconds))
    return {'epoch_seconds': walls, 'test_acc': result.test_acc[-1]}


def memory(spec):
    """Resident memory after each epoch of a short simple-CNN run, and the peak (MiB)."""
    rss = []
    _run_training(spec, lambda r: rss.append(_rss_mb()))
    return {'rss_mb': rss, 'peak_mb': _peak_rss_mb(), 'growth': rss[-1] / rss[0] - 1}


WORKERS = {f.__name__: f for f in (throughput, gemm, torch_throughput, torch_gemm, pipeline,
                                   evaluation, end_to_end, memory)}

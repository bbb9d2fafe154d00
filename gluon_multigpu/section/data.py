"""Fashion-MNIST and MNIST from the standard IDX ``.gz`` files, as batches of ``mxnet.np`` arrays.

The files are read and validated here (gzip integrity, IDX magic numbers,
dimensions, payload length, matching image and label counts, label range)
instead of through ``gluon.data.vision``, whose SHA-1 check rejects the
original Zalando release although its content is the same.
"""
import gzip
import math
import os
import stat
import struct
import urllib.request
import zlib

import numpy as onp
from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import np, npx

from ..errors import DataError
from ..filesafety import atomic
# Expected sizes of the data sets this package knows: samples per split, image shape, classes.
from ..base.values import DATASETS, known

__all__ = ['IDX_FILES', 'DATASETS', 'MAX_ITEMS', 'default_root', 'input_files', 'read_idx',
           'read_split', 'ArrayLoader', 'train_loader', 'synthetic_data', 'check_data_dir',
           'download_dataset', 'load_data', 'load_data_fashion_mnist', 'load_data_mnist']

#: The four standard file names, by split and kind.
IDX_FILES = {('train', 'images'): 'train-images-idx3-ubyte.gz',
             ('train', 'labels'): 'train-labels-idx1-ubyte.gz',
             ('test', 'images'): 't10k-images-idx3-ubyte.gz',
             ('test', 'labels'): 't10k-labels-idx1-ubyte.gz'}

#: Where MXNet's own dataset classes download these files from.
MXNET_MIRROR = 'https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/gluon/dataset/'

#: The element types of an IDX file, by its magic number's third byte (big-endian).
_IDX_DTYPES = {0x08: 'u1', 0x09: 'i1', 0x0B: '>i2', 0x0C: '>i4', 0x0D: '>f4', 0x0E: '>f8'}


def default_root(name='fashion-mnist'):
    """Return MXNet's usual data directory for a data set, ``~/.mxnet/datasets/<name>``."""
    return os.path.join(mx.base.data_dir(), 'datasets', name)


def input_files(dataset, data_dir=None):
    """The files a run on data set ``dataset`` reads from ``data_dir`` (None: the data set's
    default folder): the ``inputs`` no output of the run may replace (``targets.check_outputs``)."""
    return [os.path.join(data_dir or default_root(dataset), name) for name in IDX_FILES.values()]


#: Most elements an IDX file of an unknown data set may hold (a header claiming
#: more is refused before anything is read): 10**8, 100 MB of uint8.
MAX_ITEMS = 10**8
#: Most dimensions of an IDX file: images are (N, H, W) or (N, H, W, C).
MAX_RANK = 4


def _read(f, n, path):
    """Read ``n`` bytes (or fewer at the end) from the gzip stream ``f``, as one line on error."""
    try:
        return f.read(n)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f'{path} is not a complete gzip file ({e}); download it again') from None


def read_idx(path, max_items=MAX_ITEMS):
    """Read one gzip-compressed IDX file into a NumPy array, validating its content.

    The header is read and checked first; then exactly the bytes it
    announces are inflated, and one more to make sure nothing follows, so a
    small file that would inflate to gigabytes is refused without holding
    more than the announced payload in memory.

    Parameters
    ----------
    path : str
        Path of an ``*-idx?-ubyte.gz`` file.
    max_items : int
        Most elements the header may announce.

    Returns
    -------
    numpy.ndarray
        The array with the shape stored in the file's header.
    """
    if kind := _not_a_file(path):
        raise DataError(f'{path} cannot be opened: it is {kind}, not a data file; put the '
                        'gzip-compressed IDX file there')
    try:
        f = gzip.open(path, 'rb')
    except FileNotFoundError:
        raise DataError(f'{path} does not exist') from None
    except OSError as e:
        raise DataError(f'{path} cannot be opened ({e.strerror or e})') from None
    with f:
        magic = _read(f, 4, path)
        if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_DTYPES:
            raise DataError(f'{path} is not an IDX file (bad magic number '
                            f'{magic.hex() or "<empty>"}); download it again')
        dtype, ndim = onp.dtype(_IDX_DTYPES[magic[2]]), magic[3]
        if not 1 <= ndim <= MAX_RANK:
            raise DataError(f'{path} has an IDX header of {ndim} dimensions (1 to {MAX_RANK} '
                            'make sense); download it again')
        if len(dims := _read(f, 4 * ndim, path)) < 4 * ndim:
            raise DataError(f'{path} has a truncated IDX header; download it again')
        shape = struct.unpack(f'>{ndim}I', dims)
        if (items := math.prod(shape)) > max_items:  # Python integers: no overflow
            raise DataError(f'{path} has an IDX header {shape} of {items} elements, more than '
                            f'the {max_items} this data set can hold; download it again')
        expected = items * dtype.itemsize
        if len(raw := _read(f, expected, path)) != expected:
            raise DataError(f'{path} holds {len(raw)} data bytes but its header {shape} needs '
                            f'{expected}; download it again')
        if _read(f, 1, path):
            raise DataError(f'{path} holds more data than its header {shape} says; download it '
                            'again')
    return onp.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder('='), copy=False)


def _not_a_file(path):
    """What ``path`` is when it is there but not a regular file (else None): for messages.

    A FIFO would block the reader forever, a directory is no file: neither is "missing".
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return 'a symbolic link to nothing' if os.path.islink(path) else None
    except OSError as e:
        return f'not readable ({e.strerror})'
    kinds = ((stat.S_ISREG, None), (stat.S_ISDIR, 'a directory'),
             (stat.S_ISFIFO, 'a FIFO (named pipe)'), (stat.S_ISSOCK, 'a socket'),
             (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'))
    return next((kind for test, kind in kinds if test(mode)), 'not a regular file')


def check_data_dir(root):
    """Raise DataError naming the directory and the four files if any file is missing.

    A name that is there but is no regular file (a directory, a FIFO, a link
    to nothing) is named as what it is, not as missing.
    """
    files = ", ".join(IDX_FILES.values())
    if os.path.lexists(root) and not os.path.isdir(root):
        raise DataError(f'{root} is {_not_a_file(root) or "a file"}, not a directory; point '
                        f'`data_dir` at the folder that holds the four files {files}')
    for name in IDX_FILES.values():
        path = os.path.join(root, name)
        if kind := (_not_a_file(path) if os.path.isdir(root) else None):
            raise DataError(f'{path} is {kind}, not a data file; put the gzip-compressed IDX '
                            f'file {name} there (point `data_dir` at the folder that holds the '
                            'four files)')
    if missing := [name for name in IDX_FILES.values()
                   if not os.path.isfile(os.path.join(root, name))]:
        where = 'does not exist' if not os.path.isdir(root) else f'lacks {", ".join(missing)}'
        raise DataError(f'{root} {where}; it must hold the four files {files} (point `data_dir` '
                        'at them, or pass `download=True`)')


def read_split(root, split='train', name=None):
    """Read and validate one split's images and labels.

    Parameters
    ----------
    root : str
        Directory with the four IDX ``.gz`` files.
    split : {'train', 'test'}
    name : str, optional
        A key of ``DATASETS``; when given, the counts and image shape must match it.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Images ``uint8 (N, 28, 28)`` and labels ``int32 (N,)``.
    """
    images_path = os.path.join(root, IDX_FILES[(split, 'images')])
    labels_path = os.path.join(root, IDX_FILES[(split, 'labels')])
    # A known data set bounds what a header may announce: its images' size.
    spec = DATASETS[name] if name is not None else None
    limit = spec[split] * int(onp.prod(spec['shape'])) if spec else MAX_ITEMS
    images, labels = read_idx(images_path, limit), read_idx(labels_path, limit)
    if images.ndim != 3 or images.dtype != onp.uint8:
        raise DataError(f'{images_path} must hold uint8 images (N, H, W), '
                        f'found {images.dtype} {images.shape}; download it again')
    if labels.ndim != 1 or labels.dtype != onp.uint8:
        raise DataError(f'{labels_path} must hold uint8 labels (N,), found {labels.dtype} '
                        f'{labels.shape}; download it again')
    if images.shape[0] != labels.shape[0]:
        raise DataError(f'{images_path} holds {images.shape[0]} images but {labels_path} holds '
                        f'{labels.shape[0]} labels; the files belong to different releases: '
                        'download both again')
    if spec and (images.shape[1:] != spec['shape'] or images.shape[0] != spec[split]):
        raise DataError(f'{images_path} holds {images.shape[0]} images of {images.shape[1:]}, '
                        f'but {name} {split} has {spec[split]} of {spec["shape"]}; check '
                        '`data_dir` and `dataset`')
    if spec and labels.size and int(labels.max()) >= spec['classes']:
        raise DataError(f'{labels_path} has label {int(labels.max())}, but {name} has '
                        f'{spec["classes"]} classes; check `dataset`, or download the file again')
    return images, labels.astype(onp.int32)


class ArrayLoader:
    """Iterate over ``(X, y)`` batches of in-memory images, like the book's DataLoader.

    ``X`` is ``float32 (batch, 1, H, W)`` in [0, 1] (the book's ``ToTensor``),
    ``y`` is ``int32 (batch,)``, both ``mxnet.np`` arrays on the CPU. With
    ``shuffle``, epoch ``e`` (counted by ``__iter__`` calls) sees a permutation
    that depends only on ``seed`` and ``e``, so a run can be repeated exactly:
    set ``epoch`` back to 0 to replay the same sequence of batches.

    Parameters
    ----------
    images : numpy.ndarray
        ``uint8 (N, H, W)``.
    labels : numpy.ndarray
        ``int32 (N,)``.
    batch_size : int
        Samples per batch.
    shuffle : bool
        Draw a new order each epoch.
    seed : int
        Seed of the shuffling.
    resize : int, optional
        Resize images to ``resize x resize`` pixels (bilinear).
    last_batch : {'keep', 'discard'}
        Keep a final batch smaller than ``batch_size``, or drop it.
    multiple : int
        A kept final batch is cut to a multiple of this many samples (the rest is dropped):
        the devices of a run whose shards must be equal (synchronised BatchNorm). 1: whole.
    """

    def __init__(self, images, labels, batch_size, shuffle=False, seed=0, resize=None,
                 last_batch='keep', multiple=1):
        if batch_size < 1:
            raise DataError(f'batch size must be positive, got {batch_size}')
        if last_batch not in ('keep', 'discard'):
            raise ValueError(f"last_batch must be 'keep' or 'discard', got {last_batch!r}")
        if not 1 <= multiple <= batch_size or batch_size % multiple:
            raise DataError(f'a batch of {batch_size} cannot be cut into shards of equal size '
                            f'for {multiple} devices; use a `batch_size` divisible by {multiple}')
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.resize, self.last_batch, self.multiple, self.epoch = resize, last_batch, multiple, 0

    def _last_size(self):
        """Samples in the final, incomplete batch (0: none)."""
        rest = len(self.labels) % self.batch_size if self.last_batch == 'keep' else 0
        return rest - rest % self.multiple

    def __len__(self):
        return len(self.labels) // self.batch_size + (1 if self._last_size() else 0)

    @property
    def num_samples(self):
        """Samples seen per epoch."""
        return len(self.labels) // self.batch_size * self.batch_size + self._last_size()

    def order(self, epoch):
        """Return the sample order of ``epoch`` (a NumPy index array)."""
        return (onp.random.default_rng([self.seed, epoch]).permutation(len(self.labels))
                if self.shuffle else onp.arange(len(self.labels)))

    def __iter__(self):
        self.epoch += 1
        return self.batches_of(self.epoch - 1)

    def batches_of(self, epoch):
        """The batches of ``epoch`` (counted from 0), whatever ``epoch`` says now."""
        order = self.order(epoch)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self._to_batch(idx[:len(idx) - len(idx) % self.multiple])

    def _to_batch(self, idx):
        # Gather and scale in NumPy, then one copy into MXNet: cheaper than
        # converting and dividing as separate MXNet operations per batch.
        images = onp.multiply(self.images[idx], onp.float32(1 / 255), dtype=onp.float32)
        X = np.array(images.reshape(len(idx), 1, *self.images.shape[1:]), dtype='float32')
        if self.resize:
            X = npx.image.resize(X.transpose(0, 2, 3, 1), size=(self.resize, self.resize))
            X = X.transpose(0, 3, 1, 2)
        return X, np.array(self.labels[idx], dtype='int32')


def train_loader(images, labels, batch_size, num_devices, seed=0, resize=None, equal_shards=False):
    """The shuffled training ``ArrayLoader`` of a run on ``num_devices``.

    A last batch of fewer samples than devices cannot be split: it is
    dropped, which beats stopping in the middle of an epoch. With
    ``equal_shards`` (synchronised BatchNorm averages the devices'
    statistics with equal weights) every batch divides evenly among the
    devices: the samples that would make the last batch uneven are dropped.
    """
    last = 'discard' if 0 < len(labels) % batch_size < num_devices else 'keep'
    return ArrayLoader(images, labels, batch_size, shuffle=True, seed=seed, resize=resize,
                       last_batch=last, multiple=num_devices if equal_shards else 1)


def download_dataset(name, root, base_url=MXNET_MIRROR):
    """Download the four IDX files of ``name`` that ``root`` lacks, each written atomically.

    Parameters
    ----------
    name : str
        A key of ``DATASETS`` (the mirror's folder name).
    root : str
        Target directory, created if needed.
    base_url : str
        Mirror URL; the files are fetched from ``base_url + name + '/' + file``.
    """
    try:
        atomic.makedirs(root)
    except OSError as e:
        raise DataError(f'cannot create the data folder {root} ({e.strerror}); give a folder '
                        'that can be written') from None
    for fname in IDX_FILES.values():
        if os.path.isfile(target := os.path.join(root, fname)):
            continue
        url = f'{base_url.rstrip("/")}/{name}/{fname}'
        try:
            with urllib.request.urlopen(url, timeout=60) as src:
                # never keep a file that does not parse; a kill leaves nothing of ours
                atomic.write_file(target, iter(lambda: src.read(1 << 20), b''), check=read_idx)
        except OSError as e:
            raise DataError(f'could not download {url} ({e}); copy the four files into {root} '
                            'by hand') from None


def load_data(name, batch_size, resize=None, root=None, download=False, num_train=None,
              num_test=None, seed=0, num_devices=1, equal_shards=False):
    """Return ``(train_iter, test_iter)`` for ``name`` ('fashion-mnist' or 'mnist').

    Parameters
    ----------
    name : str
        A key of ``DATASETS``.
    batch_size : int
        Total samples per batch (split across the devices later).
    resize : int, optional
        Resize images to ``resize x resize`` pixels.
    root : str, optional
        Folder of the four IDX ``.gz`` files; None: ``default_root(name)``.
    download : bool
        Fetch missing files from MXNet's mirror instead of stopping.
    num_train, num_test : int, optional
        Use only the first samples of each split (for quick runs and tests).
    seed : int
        Seed of the training set's shuffling.
    num_devices : int
        Devices the batches are split across: a last training batch with fewer samples
        is dropped (``train_loader``).
    equal_shards : bool
        Drop the samples that would make the last training batch divide unevenly among
        the devices (``train_loader``).

    Returns
    -------
    (ArrayLoader, ArrayLoader)
        The shuffled training batches and the test batches, in order.
    """
    known(name, DATASETS, 'dataset', DataError)
    root = os.path.expanduser(root or default_root(name))
    if download:
        download_dataset(name, root)
    check_data_dir(root)
    splits = {}
    for split, limit in (('train', num_train), ('test', num_test)):
        images, labels = read_split(root, split, name)
        if limit is not None and not 0 < limit <= len(labels):
            raise DataError(f'{split} subset size must be in 1..{len(labels)}, got {limit}')
        splits[split] = (images[:limit], labels[:limit])
    return (train_loader(*splits['train'], batch_size, num_devices, seed, resize, equal_shards),
            ArrayLoader(*splits['test'], batch_size, shuffle=False, resize=resize))


def synthetic_data(name, batch_size, num_train=None, num_test=None, seed=0, num_devices=1,
                   equal_shards=False):
    """Return ``(train_iter, test_iter)`` of random images and labels shaped like data set ``name``.

    For speed tests without files (no accuracy to speak of): uint8 images
    and labels drawn from ``seed``, as many as the data set has unless
    ``num_train``/``num_test`` say otherwise.
    """
    known(name, DATASETS, 'dataset', DataError)
    spec, rng = DATASETS[name], onp.random.default_rng(seed)

    def split(n):
        return (rng.integers(0, 256, size=(n, *spec['shape']), dtype=onp.uint8),
                rng.integers(0, spec['classes'], size=n).astype(onp.int32))
    train = split(num_train or spec['train'])
    return (train_loader(*train, batch_size, num_devices, seed, equal_shards=equal_shards),
            ArrayLoader(*split(num_test or spec['test']), batch_size))


def load_data_fashion_mnist(batch_size, resize=None, root=None, **kwargs):
    """Return ``(train_iter, test_iter)`` of Fashion-MNIST (d2l 3.5); see ``load_data``."""
    return load_data('fashion-mnist', batch_size, resize=resize, root=root, **kwargs)


def load_data_mnist(batch_size, resize=None, root=None, **kwargs):
    """Return ``(train_iter, test_iter)`` of MNIST (the Gluon lab's data); see ``load_data``."""
    return load_data('mnist', batch_size, resize=resize, root=root, **kwargs)

import gzip
import os
import struct

import numpy as onp
import pytest

import gluon_multigpu as gm
from gluon_multigpu.section.data import IDX_FILES


def idx_bytes(array, type_code=0x08):
    """Encode an array in the IDX format by hand (big-endian header, then the payload)."""
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f'>{array.ndim}I', *array.shape)
    return header + array.astype('>u1' if type_code == 0x08 else array.dtype).tobytes()


def write_gz(path, payload):
    with gzip.open(path, 'wb') as f:
        f.write(payload)


def make_dataset(root, n_train=12, n_test=5, hw=(28, 28), seed=0):
    """Write a small but valid set of the four IDX files; return the arrays written."""
    rng = onp.random.default_rng(seed)
    arrays = {}
    os.makedirs(root, exist_ok=True)
    for split, n in (('train', n_train), ('test', n_test)):
        images = rng.integers(0, 256, size=(n, *hw), dtype=onp.uint8)
        labels = rng.integers(0, 10, size=n, dtype=onp.uint8)
        write_gz(os.path.join(root, IDX_FILES[(split, 'images')]), idx_bytes(images))
        write_gz(os.path.join(root, IDX_FILES[(split, 'labels')]), idx_bytes(labels))
        arrays[split] = (images, labels)
    return arrays


# --- the real files -------------------------------------------------------

def test_real_fashion_mnist_counts_and_label_histogram(fashion_train, fashion_test):
    for (images, labels), n in ((fashion_train, 60000), (fashion_test, 10000)):
        assert images.shape == (n, 28, 28) and images.dtype == onp.uint8
        assert labels.dtype == onp.int32
        assert onp.bincount(labels).tolist() == [n // 10] * 10  # balanced, per the README
    assert fashion_train[0].max() == 255 and fashion_train[0].min() == 0


def test_real_mnist_counts_match_the_published_histogram(mnist_dir):
    images, labels = gm.read_split(str(mnist_dir), 'train', 'mnist')
    assert images.shape == (60000, 28, 28)
    assert onp.bincount(labels).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265,
                                             5851, 5949]
    test_images, test_labels = gm.read_split(str(mnist_dir), 'test', 'mnist')
    assert test_images.shape == (10000, 28, 28) and test_labels.shape == (10000,)


def test_loader_on_real_data_yields_the_books_tensors(fashion_dir):
    train_iter, test_iter = gm.load_data_fashion_mnist(256, root=str(fashion_dir), num_test=600)
    X, y = next(iter(train_iter))
    assert X.shape == (256, 1, 28, 28) and X.dtype == onp.float32
    assert y.shape == (256,) and y.dtype == onp.int32
    assert 0.0 <= float(X.min()) and float(X.max()) <= 1.0
    assert len(train_iter) == 235 and len(test_iter) == 3  # 60000/256 rounded up; 600/256


# --- generated files --------------------------------------------------------

def test_read_idx_round_trips_generated_files(tmp_path):
    arrays = make_dataset(tmp_path)
    images, labels = gm.read_split(str(tmp_path), 'train')
    onp.testing.assert_array_equal(images, arrays['train'][0])
    onp.testing.assert_array_equal(labels, arrays['train'][1])


def test_read_idx_other_type_codes(tmp_path):
    data = onp.arange(6, dtype='>i4').reshape(2, 3)
    path = tmp_path / 'ints.gz'
    write_gz(path, idx_bytes(data, 0x0C))
    out = gm.read_idx(str(path))
    assert out.dtype == onp.int32 and out.dtype.isnative
    onp.testing.assert_array_equal(out, data)


def test_truncated_gzip_is_refused(tmp_path):
    make_dataset(tmp_path)
    path = tmp_path / IDX_FILES[('train', 'images')]
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(gm.DataError, match='not a complete gzip file'):
        gm.read_idx(str(path))


def test_garbage_instead_of_gzip_is_refused(tmp_path):
    path = tmp_path / 'x.gz'
    path.write_bytes(b'this is not gzip at all')
    with pytest.raises(gm.DataError, match='not a complete gzip file'):
        gm.read_idx(str(path))


def test_wrong_magic_number_is_refused(tmp_path):
    path = tmp_path / 'bad.gz'
    write_gz(path, b'\x01\x02\x08\x01' + struct.pack('>I', 3) + b'abc')
    with pytest.raises(gm.DataError, match='bad magic number 01020801'):
        gm.read_idx(str(path))


def test_payload_shorter_than_header_says_is_refused(tmp_path):
    path = tmp_path / 'short.gz'
    write_gz(path, idx_bytes(onp.zeros((4, 2, 2), onp.uint8))[:-3])
    with pytest.raises(gm.DataError, match='holds 13 data bytes but its header'):
        gm.read_idx(str(path))


def test_mismatched_image_and_label_counts_are_refused(tmp_path):
    make_dataset(tmp_path)
    write_gz(tmp_path / IDX_FILES[('train', 'labels')], idx_bytes(onp.zeros(11, onp.uint8)))
    with pytest.raises(gm.DataError, match='holds 12 images but .* holds 11 labels'):
        gm.read_split(str(tmp_path), 'train')


def test_wrong_size_for_a_known_dataset_is_refused(tmp_path):
    make_dataset(tmp_path)
    with pytest.raises(gm.DataError, match='but fashion-mnist train has 60000'):
        gm.read_split(str(tmp_path), 'train', 'fashion-mnist')


def test_label_out_of_range_is_refused(tmp_path, monkeypatch):
    make_dataset(tmp_path, n_train=3)
    write_gz(tmp_path / IDX_FILES[('train', 'labels')], idx_bytes(onp.array([1, 2, 12], onp.uint8)))
    monkeypatch.setitem(gm.DATASETS, 'tiny', {'train': 3, 'test': 5, 'shape': (28, 28),
                                              'classes': 10})
    with pytest.raises(gm.DataError, match='has label 12'):
        gm.read_split(str(tmp_path), 'train', 'tiny')


def test_missing_files_message_names_directory_and_all_four_files(tmp_path):
    make_dataset(tmp_path)
    os.remove(tmp_path / IDX_FILES[('test', 'labels')])
    with pytest.raises(gm.DataError) as err:
        gm.load_data_fashion_mnist(4, root=str(tmp_path))
    message = str(err.value)
    assert str(tmp_path) in message and 'lacks t10k-labels-idx1-ubyte.gz' in message
    assert all(name in message for name in IDX_FILES.values())


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(gm.DataError, match=f'{tmp_path / "nope"} does not exist'):
        gm.load_data_mnist(4, root=str(tmp_path / 'nope'))


# --- the loader -------------------------------------------------------------

@pytest.fixture
def tiny(monkeypatch):
    """Register the generated data set's sizes so that ``load_data`` validates against them."""
    def register(n_train=12, n_test=5):
        monkeypatch.setitem(gm.DATASETS, 'tiny', {'train': n_train, 'test': n_test,
                                                  'shape': (28, 28), 'classes': 10})
        return 'tiny'
    return register


def epoch_labels(loader):
    return [y.asnumpy() for _, y in loader]


def test_train_shuffles_every_sample_once_and_test_keeps_order(tmp_path, tiny):
    arrays = make_dataset(tmp_path, n_train=50, n_test=23)
    images, labels = gm.read_split(str(tmp_path), 'train')
    loader = gm.ArrayLoader(images, onp.arange(50, dtype=onp.int32), 8, shuffle=True, seed=3)
    first, second = epoch_labels(loader), epoch_labels(loader)
    for epoch in (first, second):
        assert sorted(onp.concatenate(epoch).tolist()) == list(range(50))
        assert [len(b) for b in epoch] == [8] * 6 + [2]
    assert onp.concatenate(first).tolist() != onp.concatenate(second).tolist()
    loader.epoch = 0  # replaying epoch 0 gives the same batches
    assert [b.tolist() for b in epoch_labels(loader)] == [b.tolist() for b in first]
    other_seed = gm.ArrayLoader(images, onp.arange(50, dtype=onp.int32), 8, shuffle=True, seed=4)
    assert onp.concatenate(epoch_labels(other_seed)).tolist() != onp.concatenate(first).tolist()
    _, test_iter = gm.load_data(tiny(50, 23), 10, root=str(tmp_path))
    assert onp.concatenate(epoch_labels(test_iter)).tolist() == arrays['test'][1].tolist()


def test_images_are_scaled_to_unit_interval_like_to_tensor(tmp_path, tiny):
    arrays = make_dataset(tmp_path)
    _, test_iter = gm.load_data(tiny(), 5, root=str(tmp_path))
    X, _ = next(iter(test_iter))
    expected = arrays['test'][0][:, None].astype(onp.float32) / 255
    onp.testing.assert_allclose(X.asnumpy(), expected, rtol=1e-6)


def test_last_batch_discard_and_keep(tmp_path, tiny):
    make_dataset(tmp_path, n_train=10)
    keep, _ = gm.load_data(tiny(10), 4, root=str(tmp_path))
    # a last batch of 2 splits over 2 devices but not over 3
    two, _ = gm.load_data('tiny', 4, root=str(tmp_path), num_devices=2)
    drop, _ = gm.load_data('tiny', 4, root=str(tmp_path), num_devices=3)
    assert [len(b) for b in epoch_labels(keep)] == [4, 4, 2] and keep.num_samples == 10
    assert [len(b) for b in epoch_labels(two)] == [4, 4, 2] and two.num_samples == 10
    assert [len(b) for b in epoch_labels(drop)] == [4, 4] and drop.num_samples == 8


def test_subsets_and_resize(tmp_path, tiny):
    make_dataset(tmp_path, n_train=12, n_test=5)
    train_iter, test_iter = gm.load_data(tiny(), 4, root=str(tmp_path), num_train=6,
                                         num_test=2, resize=32)
    X, _ = next(iter(train_iter))
    assert X.shape == (4, 1, 32, 32)
    assert train_iter.num_samples == 6 and len(test_iter.labels) == 2
    with pytest.raises(gm.DataError, match='subset size must be in 1..12'):
        gm.load_data('tiny', 4, root=str(tmp_path), num_train=13)


def test_download_fills_missing_files_atomically(tmp_path):
    mirror = tmp_path / 'mirror' / 'mnist'
    arrays = make_dataset(mirror)
    target = tmp_path / 'data'
    gm.data.download_dataset('mnist', str(target), base_url=(tmp_path / 'mirror').as_uri())
    assert sorted(os.listdir(target)) == sorted(IDX_FILES.values())  # no temporary files left
    images, _ = gm.read_split(str(target), 'test')
    onp.testing.assert_array_equal(images, arrays['test'][0])


def test_download_of_a_corrupt_file_leaves_nothing_behind(tmp_path):
    mirror = tmp_path / 'mirror' / 'mnist'
    make_dataset(mirror)
    (mirror / IDX_FILES[('test', 'images')]).write_bytes(b'garbage')
    target = tmp_path / 'data'
    with pytest.raises(gm.DataError):
        gm.data.download_dataset('mnist', str(target), base_url=(tmp_path / 'mirror').as_uri())
    assert IDX_FILES[('test', 'images')] not in os.listdir(target)
    assert not [f for f in os.listdir(target) if f.endswith('.part')]

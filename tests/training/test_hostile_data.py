"""Data files made to hurt: a gzip bomb, absurd headers, trailing data; bounded and one line."""
import gzip
import os
import struct
import sys
import zlib

import numpy as onp
import pytest

import gluon_multigpu as gm
from conftest import REPO, data_with, run_bounded

pytestmark = pytest.mark.slow  # subprocesses or real training: the full suite's


def write_bomb(path, header, zeros):
    """A gzip file: ``header``, then ``zeros`` zero bytes, compressed in chunks (small on disk)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    chunk = bytes(1 << 20)
    with open(path, 'wb') as f:
        f.write(compressor.compress(header))
        for _ in range(zeros // len(chunk)):
            f.write(compressor.compress(chunk))
        f.write(compressor.flush())


def header(type_code, *dims):
    return bytes([0, 0, type_code, len(dims)]) + struct.pack(f'>{len(dims)}I', *dims)


@pytest.fixture(scope='module')
def bomb_dir(fashion_dir, tmp_path_factory):
    """The real data with the test images replaced by a valid header and 1 GiB of zeros."""
    return data_with(fashion_dir, tmp_path_factory.mktemp('bomb'), 't10k-images-idx3-ubyte.gz',
                     lambda path: write_bomb(path, header(0x08, 10000, 28, 28), 1 << 30))


def test_a_gzip_bomb_is_refused_without_inflating_it(bomb_dir):
    assert os.path.getsize(bomb_dir / 't10k-images-idx3-ubyte.gz') < 2 * 2**20
    code = ('import resource, sys; import gluon_multigpu as gm\n'
            'before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n'
            'try:\n'
            f'    gm.read_split({str(bomb_dir)!r}, "test", "fashion-mnist")\n'
            '    print("read")\n'
            'except gm.DataError as e:\n'
            '    print("refused", e)\n'
            'print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n')
    proc = run_bounded([sys.executable, '-c', code], timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith('refused') and 'holds more data than its header' in lines[0]
    # the images are 7.8 MB; the bomb would be 1024 MiB (the code before: 4.1 GB for 4 GiB)
    assert int(lines[-1]) < 100, f'peak memory grew by {lines[-1]} MiB'


@pytest.mark.parametrize('head, phrase', [
    (header(0x08, 2**32 - 1, 2**32 - 1, 2**32 - 1), 'more than the'),
    (header(0x08, 10, 28, 28, 1, 1, 1), 'an IDX header of 6 dimensions'),
    (bytes([0, 0, 0x08, 0]), 'an IDX header of 0 dimensions'),
    (header(0x0D, 2**31, 2**31), 'more than the'),
])
def test_absurd_headers_are_one_line(tmp_path, head, phrase):
    path = tmp_path / 'x.gz'
    with gzip.open(path, 'wb') as f:
        f.write(head + bytes(16))
    with pytest.raises(gm.DataError, match=phrase):
        gm.read_idx(str(path))


def test_trailing_data_and_a_directory_are_refused(tmp_path):
    path = tmp_path / 'x.gz'
    with gzip.open(path, 'wb') as f:
        f.write(header(0x08, 4) + bytes(4) + b'extra')
    with pytest.raises(gm.DataError, match='holds more data than its header'):
        gm.read_idx(str(path))
    with pytest.raises(gm.DataError, match='cannot be opened'):
        gm.read_idx(str(tmp_path))
    values = onp.arange(6, dtype=onp.uint8).reshape(2, 3)
    with gzip.open(path, 'wb') as f:
        f.write(header(0x08, 2, 3) + values.tobytes())
    onp.testing.assert_array_equal(gm.read_idx(str(path)), values)  # an exact file still reads


@pytest.mark.parametrize('script, args', [
    ('train.py', ['--cpu-devices', '1', '--num-epochs', '1']),
    ('bandwidth.py', ['--cpu-devices', '2', '--quick']),
    ('scaling.py', ['--cpu-devices', '1', '--num-epochs', '1']),
])
def test_every_script_answers_a_bomb_in_one_line(bomb_dir, tmp_path, script, args):
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / script), *args, '--data-dir',
                        str(bomb_dir)], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and 'Traceback' not in proc.stderr
    assert proc.stderr.startswith('error: ') and 'holds more data than its header' in proc.stderr
    assert os.listdir(tmp_path) == []

"""Shared fixtures: the real data sets beside the checkout, and the scripts as modules."""
import importlib.util
import os
import pathlib

import pytest

import gluon_multigpu as gm

REPO = pathlib.Path(__file__).resolve().parents[1]
# The data sets live in ../shared/data beside the checkout (CI puts them there);
# GLUON_MULTIGPU_DATA points elsewhere.
DATA = pathlib.Path(os.environ.get('GLUON_MULTIGPU_DATA', REPO.parent / 'shared' / 'data'))


def data_dir(name):
    """Return the directory of a real data set, failing loudly if it is not there."""
    path = DATA / name
    missing = [f for f in gm.data.IDX_FILES.values() if not (path / f).is_file()]
    if missing:
        pytest.fail(f'the real {name} files are missing from {path} ({", ".join(missing)}); '
                    'set GLUON_MULTIGPU_DATA to the folder that holds fashion-mnist/ and mnist/')
    return path


@pytest.fixture(scope='session')
def fashion_dir():
    return data_dir('fashion-mnist')


@pytest.fixture(scope='session')
def mnist_dir():
    return data_dir('mnist')


@pytest.fixture(scope='session')
def fashion_train(fashion_dir):
    """The full Fashion-MNIST training split as NumPy arrays (read once)."""
    return gm.read_split(str(fashion_dir), 'train', 'fashion-mnist')


@pytest.fixture(scope='session')
def fashion_test(fashion_dir):
    return gm.read_split(str(fashion_dir), 'test', 'fashion-mnist')


def load_script(name):
    """Import ``scripts/<name>.py`` as a module, so tests can call its ``main(argv)``."""
    spec = importlib.util.spec_from_file_location(f'script_{name}', REPO / 'scripts' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory in which this process cannot create files.

    For an ordinary user, one without write permission. Root ignores
    permission bits, so for root /sys, where nobody may create files.
    """
    if os.geteuid() != 0:
        directory = tmp_path / 'read-only'
        directory.mkdir()
        directory.chmod(0o555)
        yield directory
        directory.chmod(0o755)
    else:
        yield '/sys'

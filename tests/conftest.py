"""Shared fixtures: the real data sets beside the checkout, the scripts as modules, subprocesses."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / 'scripts'))
import _cli  # noqa: E402  (imports no MXNet)

# The tests run several CPU contexts in one process, as the scripts do: the
# same engine settings, in place before MXNet loads.
_cli.apply_engine_settings()

import gluon_multigpu as gm  # noqa: E402
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


def run_bounded(args, timeout=300, **kwargs):
    """``subprocess.run`` with a deadline: past it the process is killed and the test fails."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed the process
        pytest.fail(f'{args[:3]}... did not end within {timeout} s; output so far: {e.stderr!r}')


def wait_bounded(proc, timeout=120):
    """``proc.wait()`` with a deadline: past it the process is killed and the test fails."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f'process {proc.args[:3]}... did not end within {timeout} s')

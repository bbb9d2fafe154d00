"""Shared fixtures: the real data sets beside the checkout, the programs as modules, processes."""
import ast
import importlib
import importlib.util
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as onp
import pytest

import gluon_multigpu as gm  # loads no MXNet
import lab

# The tests run several CPU contexts in one process, as the programs do: the
# same engine settings, in place before MXNet loads.
gm.engine.configure()
# The tests run on several workers (setup.cfg) and start programs of their own: several MXNet
# processes share the cores. OpenMP's threads (libgomp's) then wait for work passively, not
# spinning: three one-context runs at once took 35 to 104 s spinning, 12 to 13 s waiting
# passively. (Alone, a run waits passively 3% slower on ResNet-18 and 1.6 times slower on the
# small CNN: the programs keep OpenMP's default, docs/results.md.) The arithmetic is the same.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

REPO = pathlib.Path(__file__).resolve().parents[1]
# The lab (lab/, not installed) is imported from the checkout: by this process (setup.cfg's
# pythonpath) and by the programs and probes the tests start, wherever their folder.
lab.child_env(os.environ)
# The data sets live in ../shared/data beside the checkout (CI puts them there);
# GLUON_MULTIGPU_DATA points elsewhere.
DATA = pathlib.Path(os.environ.get('GLUON_MULTIGPU_DATA', REPO.parent / 'shared' / 'data'))


#: The xdist groups of the tests that must not overlap one another: SERIAL, the clusters of
#: network namespaces (tests/cluster_fixture.py; their multi-host, failover and network tests);
#: TIMING, the tests that time a signal's or a launcher's answer. (Two groups, not one: together
#: they were the longest group by far, 27 of a 31-minute run on a loaded machine.) Mark a module
#: with ``pytestmark = pytest.mark.xdist_group(SERIAL)``, or one test.
SERIAL, TIMING = 'serial', 'timing'


#: The groups that take longest (minutes each), started first when the tests run on several
#: workers (setup.cfg: ``--no-loadscope-reorder`` keeps this order), so that no worker is left
#: with a long one at the end while the other has nothing to do. Only an order: a group not
#: named here runs after these, in the order of its file. The fault harness comes first, in a
#: worker that has trained nothing yet: it forks the worker at each of its 78 file calls, and a
#: fork costs what the parent has mapped (in a worker grown by in-process training, its tests
#: took 149 CPU-s of the suite's 1,451, alone 31).
LONGEST_FIRST = ('test_fault_harness', SERIAL, 'test_readme', 'test_slurm', 'test_memory', TIMING,
                 'test_distributed', 'test_notebook', 'test_faults', 'test_hostile_run',
                 'test_hostile_checkpoints')


def xdist_group_of(item):
    mark = item.get_closest_marker('xdist_group')
    return (mark.args or [mark.kwargs.get('name', 'default')])[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each test not in a named xdist group joins the group of its file, so that with
    ``--dist loadgroup`` (setup.cfg) a file runs whole on one worker: its module fixtures are
    made once and its tests keep their order. (Runs before xdist names the groups.) On a
    worker, the groups of LONGEST_FIRST come first; run in one process, the order is the
    files' own."""
    for item in items:
        if item.get_closest_marker('xdist_group') is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    if os.environ.get('PYTEST_XDIST_WORKER'):
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(xdist_group_of(item), len(rank)))  # stable
        if config.getvalue('loadgroup'):
            for item in items:
                name_group(item)


def name_group(item):
    """Append ``@<group>`` to the test's id, which is how xdist's scheduler reads the group.
    xdist does this itself by setting ``item._nodeid``, which pytest 9 no longer reads (its id is
    ``item._id``): without this every test was a group of its own."""
    wanted = f'{item.nodeid}@{xdist_group_of(item)}'
    if '@' in item.nodeid[item.nodeid.rfind(']') + 1:]:
        return  # named already (by a version of xdist and pytest that agree)
    try:
        from _pytest.nodeid import coerce_node_id  # pylint: disable=import-outside-toplevel
    except ImportError:  # before pytest 9: xdist's own _nodeid is read
        return
    item._id = coerce_node_id(wanted)  # pylint: disable=protected-access


#: The stop signals' handlers every test begins with: Python's own. Not the ones the process
#: inherited: a suite started in the background by a shell (``pytest ... &``) inherits SIGINT
#: ignored, and then no Ctrl-C test could stop anything, here or in the programs it starts.
STOP_HANDLERS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
                 signal.SIGHUP: signal.SIG_DFL}


@pytest.fixture(autouse=True)
def stop_handlers_as_found():
    """Every test begins and ends with Python's own handlers of the stop signals.

    A program run in-process installs its start-up handler and, once it has stopped a run,
    ignores the stop signals (as a process about to end would); a module's fixture may too.
    Left in place, they decided what a later test on the same worker saw (``Interruptible``
    leaves a handler that is not Python's alone, so its Ctrl-C never came).
    """
    def reset():
        for signum, handler in STOP_HANDLERS.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
    reset()
    yield
    reset()


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


def data_with(fashion_dir, folder, name, write):
    """``folder`` made a copy of the real Fashion-MNIST files (linked), but for file ``name``,
    which ``write(path)`` writes in its place; return ``folder``."""
    for idx in gm.data.IDX_FILES.values():
        if idx != name:
            os.symlink(fashion_dir / idx, folder / idx)
    write(folder / name)
    return folder


@pytest.fixture(scope='session')
def truncated_dir(fashion_dir, tmp_path_factory):
    """The real data with the test images cut short (the other files linked): a reader stops at
    ``not a complete gzip file``."""
    name = 't10k-images-idx3-ubyte.gz'
    return data_with(fashion_dir, tmp_path_factory.mktemp('truncated'), name,
                     lambda path: path.write_bytes((fashion_dir / name).read_bytes()[:5000]))


def load_script(name):
    """The program ``scripts/<name>.py`` starts, as a module (``gluon_multigpu.cli.train``,
    ``lab.commands.scaling``: the one the script imports), so tests can call its
    ``main(argv)`` and its functions, and patch them."""
    script = REPO / 'scripts' / f'{name}.py'
    assert script.is_file(), f'scripts/{name}.py is missing'
    found = [f'{node.module}.{alias.name}' for node in ast.walk(ast.parse(script.read_text()))
             if isinstance(node, ast.ImportFrom) for alias in node.names]
    assert len(found) == 1, (name, found)
    return importlib.import_module(found[0])


def load_tool(name):
    """The maintainers' tool ``tools/<name>.py`` as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / 'tools' / f'{name}.py')
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


#: float32's machine epsilon (2**-23): the spacing of the floats from 1 to 2.
EPS32 = float(onp.finfo(onp.float32).eps)


def simple_cnn_terms(batch):
    """Per parameter of ``simple_cnn`` (in order): the products summed into one gradient element.

    A convolution's weight and bias gradients sum over the batch and the layer's
    output positions (26 x 26 for the first, 9 x 9 for the second on 28 x 28
    images); a dense layer's over the batch.
    """
    return [batch * 26 * 26] * 2 + [batch * 9 * 9] * 2 + [batch] * 4


def one_step_bound(before, after, terms):
    """How far two float32 results of one SGD step from ``before`` may lie apart by rounding alone.

    Both compute ``w - lr * g / B`` from the same ``w`` and the same samples;
    they differ in the order in which they sum the ``terms`` products that
    make an element of ``g`` (the shares of the devices, then their sum; kernels
    that split a sum by thread). A float32 sum of n terms in any order is within
    (n - 1) eps/2 times the sum of their magnitudes of the exact sum (Higham,
    *Accuracy and Stability of Numerical Algorithms*, 4.2), so two orders lie
    at most n eps times that apart. That sum of magnitudes, times lr / B, is
    taken as the largest update of the tensor, ``after - before`` (the terms
    of a gradient element mostly share a sign; a bound, not a fit: the
    differences measured are orders of magnitude below it). Each result is
    then rounded once more to a float near ``after``: eps times its magnitude.
    Returns one bound per tensor.
    """
    return [EPS32 * (onp.abs(a).max() + n * onp.abs(a - w).max())
            for w, a, n in zip(before, after, terms)]


def assert_one_step_close(before, a, b, terms, names=None):
    """Assert that parameters ``a`` and ``b`` after one step from ``before`` agree to rounding."""
    for i, (x, y, bound) in enumerate(zip(a, b, one_step_bound(before, a, terms))):
        worst = float(onp.abs(x - y).max())
        assert worst <= bound, (f'{names[i] if names else i}: {worst:.3g} apart after one step, '
                                f'more than rounding allows ({bound:.3g})')


#: Sets resource limits, then becomes the command (``limited``).
_LIMITED = ('import os, resource, sys\n'
            'for name, value in (a.split("=") for a in sys.argv[1].split(",")):\n'
            '    resource.setrlimit(getattr(resource, name), (int(value), int(value)))\n'
            'os.execv(sys.argv[2], sys.argv[2:])')


def limited(args, **limits):
    """``args`` (a command line whose first word is a path) run with resource limits set first,
    ``limited(args, FSIZE=1024)``: what a ``preexec_fn`` setting them did, without forking the
    test process (a ``preexec_fn`` rules out vfork, and the fork of a worker that has loaded
    MXNet failed with ENOMEM on a loaded machine)."""
    spec = ','.join(f'RLIMIT_{name}={value}' for name, value in limits.items())
    return [sys.executable, '-c', _LIMITED, spec, *args]


def run_bounded(args, timeout=300, **kwargs):
    """``subprocess.run`` with a deadline: past it the process is killed and the test fails."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed the process
        pytest.fail(f'{args[:3]}... did not end within {timeout} s; output so far: {e.stderr!r}')


def wait_bounded(proc, timeout=120):
    """``proc.wait()`` with a deadline: past it the process is killed and the test fails.

    Once it has ended, the ``Lines`` reading its output have read it to the end (a few
    seconds at most: a child it left may hold the pipe), so that what the test reads next
    is all it wrote: a loaded machine had left a process's last line unread (an empty
    ``Lines.text()`` after a status 130 whose line had been written).
    """
    try:
        status = proc.wait(timeout=timeout)
        for stream in (proc.stdout, proc.stderr):
            reader = Lines.OF.get(stream) if stream is not None else None
            if reader is not None:
                reader.settle()
        return status
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f'process {proc.args[:3]}... did not end within {timeout} s')


def children(pid):
    """The process ids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{entry}/stat') as f:
                if int(f.read().rsplit(')', 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def descendants(pid):
    """Every process below ``pid``: its children, theirs, and so on (from /proc)."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def alive(pid):
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


class Lines:
    """The lines of a process's output ``stream``, each with the time it arrived, read by a thread.

    ``wait_for`` waits for a line with a deadline, and fails if the stream ends first.
    """

    #: The ``Lines`` of each stream read (``wait_bounded`` lets them read to the end).
    OF = weakref.WeakKeyDictionary()

    def __init__(self, stream):
        self.lines, self._cond = [], threading.Condition()
        Lines.OF[stream] = self
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip('\n')))
                self._cond.notify_all()
        with self._cond:
            self.lines.append((time.monotonic(), None))
            self._cond.notify_all()

    def wait_for(self, pattern, timeout=120, start=0):
        """The (time, line) of the first line from ``start`` on that matches ``pattern``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(start, len(self.lines)):
                    when, line = self.lines[i]
                    if line is None:
                        raise AssertionError(f'the process ended before {pattern!r}: '
                                             f'{[l for _, l in self.lines]}')
                    if re.search(pattern, line):
                        return when, line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f'no line {pattern!r} within {timeout} s')
                self._cond.wait(left)

    def wait_ended(self, timeout=30):
        """Wait until the stream has ended (every line read); fail after ``timeout`` s."""
        with self._cond:
            if not self._cond.wait_for(self.ended, timeout):
                raise AssertionError(f'the stream did not end within {timeout} s')

    def settle(self, timeout=10):
        """Wait up to ``timeout`` s for the stream's end; whether it ended (no failure)."""
        with self._cond:
            return self._cond.wait_for(self.ended, timeout)

    def ended(self):
        """Whether the stream has ended (the process closed it, or ended)."""
        with self._cond:
            return bool(self.lines) and self.lines[-1][1] is None

    def text(self):
        """Every line so far."""
        with self._cond:
            return [l for _, l in self.lines if l is not None]

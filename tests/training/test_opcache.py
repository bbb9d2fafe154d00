"""MXNet's operator functions from the cache file (``base.opcache``) are MXNet's own.

Each check runs fresh processes (the cache acts as MXNet loads) with a cache
folder of the test's own (``XDG_CACHE_HOME``): the first writes the file, the
next take every function from it. What they make is compared with what MXNet
makes with the cache off, and with MXNet's own generator run again beside it.
"""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from conftest import run_bounded

#: In a fresh process: load MXNet as the package does, then print what this test compares.
PROBE = r'''
import hashlib, inspect, json, sys, types
import gluon_multigpu._mxnet, mxnet
from gluon_multigpu.base import opcache
from mxnet import base, np, npx, autograd, gluon

def handles(code):
    out = []
    for c in code.co_consts:
        if type(c) is int and c > 2 ** 16:
            out.append(c)
        elif isinstance(c, types.CodeType):
            out.extend(handles(c))
    return out

def shape(code):  # the code with its handle left out (an address: it differs between processes)
    return (code.co_code, code.co_names, code.co_varnames, tuple(
        shape(c) if isinstance(c, types.CodeType) else 'handle' if type(c) is int and c > 2 ** 16
        else repr(c) for c in code.co_consts))

functions = {}
for name, module in sorted(sys.modules.items()):
    if not name.startswith('mxnet') or module is None:
        continue
    for attr, f in sorted(vars(module).items()):
        if isinstance(f, types.FunctionType) and f.__code__.co_filename == '<string>':
            functions[f'{name}.{attr}'] = hashlib.sha256(repr((
                f.__name__, f.__module__, f.__doc__, str(inspect.signature(f)),
                shape(f.__code__), f.__defaults__)).encode()).hexdigest()
# every handle written into a function is the one MXNet's library gives for an operator now
names = []
plist, size = base.ctypes.POINTER(base.ctypes.c_char_p)(), base.ctypes.c_uint()
base.check_call(base._LIB.MXListAllOpNames(base.ctypes.byref(size), base.ctypes.byref(plist)))
live = set()
for i in range(size.value):
    h = base.OpHandle()
    base.check_call(base._LIB.NNGetOpHandle(plist[i], base.ctypes.byref(h)))
    live.add(h.value)
written = {h for m in list(sys.modules.values()) if m is not None and (m.__name__ or '').startswith('mxnet')
           for f in vars(m).values() if isinstance(f, types.FunctionType)
           and f.__code__.co_filename == '<string>' for h in handles(f.__code__)}
# a step of a small network: forward, backward, update
mxnet.random.seed(3)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(4, 3, activation='relu'), gluon.nn.MaxPool2D(), gluon.nn.Dense(10))
net.initialize(mxnet.init.Uniform(0.07))
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.3})
X = np.random.uniform(size=(8, 1, 12, 12))
y = np.arange(8) % 10
with autograd.record():
    loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(X), y)
loss.backward()
trainer.step(8)
weights = [p.data().asnumpy().tolist() for p in net.collect_params().values()]
print(json.dumps({'stats': opcache.stats(), 'functions': functions, 'weights': weights,
                  'loss': loss.asnumpy().tolist(), 'handles_live': written <= live,
                  'handles': len(written)}))
'''


#: A lighter probe, for the files a process must not read: what it took from the cache, and
#: operators of each kind computing as they should (a wrong handle runs another operator).
LIGHT = r'''
import json
import gluon_multigpu._mxnet, mxnet
from gluon_multigpu.base import opcache
from mxnet import np, npx, nd
a = np.arange(6).reshape(2, 3) - 2
print(json.dumps({'stats': opcache.stats(), 'values': [
    npx.relu(a).tolist(), np.cumsum(a).tolist(), nd.abs(a.as_nd_ndarray()).asnumpy().tolist(),
    mxnet.sym.relu(mxnet.sym.var('x')).eval(x=nd.array([-1, 2]))[0].asnumpy().tolist()]}))
'''
#: What LIGHT prints when every operator is MXNet's own.
LIGHT_VALUES = [[[0, 0, 0], [1, 2, 3]], [-2, -3, -3, -2, 0, 3], [[2, 1, 0], [1, 2, 3]], [0, 2]]


def probe(cache_home, tmp_path, code=PROBE, **environ):
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), **environ)
    done = run_bounded([sys.executable, '-c', code], timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert code is PROBE or found['values'] == LIGHT_VALUES
    return found


def cache_files(cache_home):
    folder = cache_home / 'gluon-multigpu'
    return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """Three processes: the cache off, the first with it on (writes), the second (reads)."""
    home, work = tmp_path_factory.mktemp('cache'), tmp_path_factory.mktemp('work')
    off = probe(home, work, GLUON_MULTIGPU_OP_CACHE='0')
    assert cache_files(home) == []  # off: nothing written
    first = probe(home, work)
    written = cache_files(home)
    second = probe(home, work)
    return off, first, second, written, home, work


def test_the_first_process_writes_the_file_and_the_next_takes_every_function_from_it(runs):
    off, first, second, written, _, work = runs
    assert off['stats']['installed'] is False and off['stats']['hits'] == 0
    assert first['stats']['hits'] == 0 and first['stats']['misses'] > 2000
    assert second['stats'] == dict(first['stats'], hits=first['stats']['misses'], misses=0)
    assert len(written) == 1 and written[0].name.startswith('mxnet-ops-')
    assert str(written[0]) == second['stats']['path']
    assert oct(written[0].stat().st_mode & 0o777) == '0o600'
    assert os.listdir(work) == []


def test_the_functions_from_the_cache_are_mxnets_own(runs):
    off, first, second, *_ = runs
    assert len(off['functions']) > 2000
    for run in (first, second):
        assert run['functions'] == off['functions']  # names, docs, signatures, code
        assert run['handles_live'] and run['handles'] == off['handles']


def test_a_training_step_is_bit_equal_with_and_without_the_cache(runs):
    off, first, second, *_ = runs
    assert first['loss'] == off['loss'] and second['loss'] == off['loss']
    assert first['weights'] == off['weights'] and second['weights'] == off['weights']


@pytest.mark.parametrize('damage', ['torn', 'garbage', 'foreign', 'others_may_write'])
def test_a_damaged_or_foreign_file_is_not_read_and_a_good_one_replaces_it(runs, damage,
                                                                          tmp_path):
    written = runs[3]
    home = tmp_path / 'home'
    folder = home / 'gluon-multigpu'
    folder.mkdir(parents=True, mode=0o700)
    planted = folder / written[0].name
    good = written[0].read_bytes()
    planted.write_bytes({'torn': good[:len(good) // 2], 'garbage': os.urandom(4096),
                         'foreign': good, 'others_may_write': good}[damage])
    planted.chmod(0o600)
    if damage == 'foreign':  # another user's: not read even whole (its code would run here)
        if os.geteuid() != 0:
            pytest.skip('giving a file to another user needs root (CI runs as root)')
        os.chown(planted, 65534, 65534)
    if damage == 'others_may_write':
        planted.chmod(0o666)
    run = probe(home, tmp_path, LIGHT)
    assert run['stats']['hits'] == 0 and run['stats']['misses'] > 2000
    if damage in ('torn', 'garbage'):  # replaced by a whole one, which the next process reads
        assert probe(home, tmp_path, LIGHT)['stats']['misses'] == 0


def test_a_cache_folder_that_cannot_be_written_changes_nothing_but_the_time(tmp_path):
    home = tmp_path / 'home'
    home.write_text('a file where the folder would be')
    run = probe(home, tmp_path, LIGHT)
    assert run['stats']['hits'] == 0 and run['stats']['misses'] > 2000
    assert home.read_text() == 'a file where the folder would be'


def test_without_a_home_folder_nothing_is_written_where_the_program_runs(tmp_path,
                                                                         monkeypatch):
    monkeypatch.delenv('HOME', raising=False)
    run = probe('relative/cache', tmp_path, LIGHT)  # XDG: a relative path is to be ignored
    assert run['stats']['path'] is None and run['stats']['misses'] > 2000
    assert os.listdir(tmp_path) == []


def test_two_processes_writing_at_once_leave_one_whole_file(tmp_path):
    home = tmp_path / 'home'
    env = dict(os.environ, XDG_CACHE_HOME=str(home))
    code = 'import gluon_multigpu._mxnet'
    procs = [subprocess.Popen([sys.executable, '-c', code], env=env, cwd=tmp_path)
             for _ in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    assert [f.name[:10] for f in cache_files(home)] == ['mxnet-ops-']  # no temporary left
    assert probe(home, tmp_path, LIGHT)['stats']['misses'] == 0


def test_what_a_killed_writer_left_is_removed_by_the_next_and_nothing_else(tmp_path):
    """The cache file is written by the output layer (``atomic.write_file``): a writer killed
    after linking its temporary leaves ``.NAME.<random>.<hash of content>.tmp``, which the next
    writer recognises by its content and removes; a file of that form whose content does not
    match is not the package's, and stays."""
    home = tmp_path / 'home'
    probe(home, tmp_path, LIGHT)  # writes the cache file: its name
    folder = home / 'gluon-multigpu'
    name, = [p.name for p in folder.iterdir()]
    (folder / name).unlink()  # the next process writes it again
    killed = folder / f'.{name}.0123abcd.{hashlib.sha256(b"half a table").hexdigest()[:16]}.tmp'
    killed.write_bytes(b'half a table')
    other = folder / f'.{name}.89abcdef.{"0" * 16}.tmp'
    other.write_bytes(b'not what its name says')
    assert probe(home, tmp_path, LIGHT)['stats']['misses'] > 2000  # it writes the cache
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, other.name])
    assert oct((folder / name).stat().st_mode & 0o777) == '0o600'

"""A checkpoint save that fails (ENOSPC, EIO) or is killed (SIGKILL) at each of its file-system
calls: the last complete checkpoint stays byte-identical, or the new one is complete; once the
next Checkpointer has opened the folder nothing is left but the checkpoint's own files; and a
user's files named like the package's are never touched.

The calls are those of ``filesafety/fs.py`` (``fs.hook`` sees each one, MXNet's writes announced by
``fs.external``). MXNet works in a forked child (it stops and restarts its engine around
``fork``), so each SIGKILL is a fork of this process, killed at its n-th call.
"""
import contextlib
import errno
import os
import select
import shutil
import signal

import mxnet as mx
import numpy as onp
import pytest
from mxnet import gluon, np

import gluon_multigpu as gm
from gluon_multigpu.filesafety import fs

CONFIG = {'run': 'faults'}
#: A user's files, named like the package's own: none may change or go.
DECOYS = {
    '.ckpt-save.abc123/notes.txt': b'my notes, in a folder named like a save folder',
    '.ckpt-save.mine/save-marker': b'a file of mine that has the marker\'s name',
    '.manifest.json.x1y2.tmp': b'a file named like an earlier atomic write',
    'ckpt-notes.txt': b'x',
}


class Counter:
    """``fs.hook``: count the calls; at the ``at``-th, call ``fault`` (which raises or kills)."""

    def __init__(self, at=None, fault=None):
        self.calls, self.at, self.fault = [], at, fault

    def __call__(self, operation, path):
        self.calls.append((operation, os.path.basename(path)))
        if len(self.calls) == self.at:
            self.fault()


def tiny(seed=0):
    """A one-layer network and its SGD-with-momentum Trainer, after one step (a state to save)."""
    mx.npx.set_np()  # the book's semantics in this thread (the layers are made with them)
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()  # nested names: MXNet loads a lone layer's file as legacy
    net.add(gluon.nn.Dense(3, in_units=4))
    net.initialize(ctx=mx.cpu())
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
    gm.train_batch(net, np.ones((2, 4)), np.zeros(2, dtype='int32'),
                   gluon.loss.SoftmaxCrossEntropyLoss(), trainer, [mx.cpu()])
    return net, trainer


def history(epochs):
    return [gm.EpochRecord(e, 1.0, 0.5, 0.5, 1.0, 0.1, 8) for e in range(1, epochs + 1)]


def snapshot(directory):
    """Every file under ``directory``: relative path -> bytes."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = open(path, 'rb').read()
    return found


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    """A folder with a complete checkpoint of epoch 1, and the user's decoys beside it."""
    directory = tmp_path_factory.mktemp('base') / 'ckpt'
    net, trainer = tiny()
    gm.Checkpointer(directory, CONFIG).save(net, trainer, history(1), 1)
    for name, data in DECOYS.items():
        os.makedirs(os.path.dirname(directory / name), exist_ok=True)
        (directory / name).write_bytes(data)
    return directory, snapshot(directory)


def fresh(base, tmp_path, case):
    directory = tmp_path / case
    shutil.copytree(base[0], directory)
    return directory


def save_epoch_two(directory):
    net, trainer = tiny(seed=1)
    gm.Checkpointer(directory, CONFIG, resume=True).save(net, trainer, history(2), 2)


def save_killed_at(n, directory, holding=contextlib.nullcontext):
    """Fork a child that saves epoch two into ``directory`` (inside ``holding()``) and is killed
    at its ``n``-th call through ``fs``; return its wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            with holding():
                fs.hook = Counter(n, lambda: os.kill(os.getpid(), signal.SIGKILL))
                save_epoch_two(directory)
            os._exit(0)
        finally:
            os._exit(1)
    return reap(pid)


def check(directory, before):
    """The old checkpoint byte for byte, or the new one complete; then nothing else is left."""
    with gm.Checkpointer(directory, CONFIG, resume=True) as opened:  # cleans what saves left
        opened.check_directory(2)
        state = opened.load()
    own = {'manifest.json', *(e['name'] for e in state.manifest['files'].values())}
    after = snapshot(directory)
    assert set(after) == own | set(DECOYS), sorted(set(after) ^ (own | set(DECOYS)))
    assert sorted(os.listdir(directory)) == sorted(
        own | {name.split('/')[0] for name in DECOYS})  # no empty folder left either
    for name in DECOYS:
        assert after[name] == before[name], name
    if state.epoch == 1:
        assert after == before  # the old checkpoint, byte for byte
    else:
        assert state.epoch == 2 and len(state.history) == 2
    net, trainer = tiny(seed=2)
    state.restore(net, trainer, [mx.cpu()])  # it loads
    return state.epoch


def count_calls(base, tmp_path):
    counter = Counter()
    fs.hook = counter
    try:
        save_epoch_two(fresh(base, tmp_path, 'count'))
    finally:
        fs.hook = None
    operations = {operation for operation, _ in counter.calls}
    assert {'mkdir', 'open', 'write', 'fsync', 'replace', 'unlink', 'rmdir'} <= operations
    return len(counter.calls)


def failed_save(directory, n, code):
    """Save epoch two into ``directory`` with the n-th fs call failing with ``code``; the error."""
    def fail():
        raise OSError(code, os.strerror(code))
    fs.hook = Counter(n, fail)
    try:
        with pytest.raises(OSError) as raised:
            save_epoch_two(directory)
    finally:
        fs.hook = None
    return raised.value


@pytest.mark.parametrize('code', [errno.ENOSPC, errno.EIO], ids=['ENOSPC', 'EIO'])
def test_a_failure_at_each_call_of_a_save_keeps_the_last_complete_checkpoint(base, tmp_path,
                                                                              code):
    calls = count_calls(base, tmp_path)
    epochs = []
    for n in range(1, calls + 1):
        directory = fresh(base, tmp_path, f'fail-{n}')

        raised = failed_save(directory, n, code)
        assert raised.errno == code, (n, raised)
        epochs.append(check(directory, base[1]))
    # the calls before the new manifest is renamed in keep the old checkpoint; those after, the new
    assert epochs[0] == 1 and epochs[-1] == 2 and epochs == sorted(epochs)


def reap(pid, timeout=120):
    """Wait for the child ``pid`` to end (its exit status); kill it and fail past ``timeout`` s."""
    fd = os.pidfd_open(pid)
    try:
        ended, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ended:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f'the forked save did not end within {timeout} s')
    return os.waitpid(pid, 0)[1]


def test_a_save_killed_at_each_call_keeps_the_last_complete_checkpoint(base, tmp_path):
    calls = count_calls(base, tmp_path)
    epochs = []
    for n in range(1, calls + 2):  # and once not killed: the save completes
        directory = fresh(base, tmp_path, f'kill-{n}')
        status = save_killed_at(n, directory)
        if n <= calls:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (n, status)
        else:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        epochs.append(check(directory, base[1]))
    assert epochs[0] == 1 and epochs[-1] == 2 and epochs == sorted(epochs)


def test_the_saved_parameters_are_the_networks(base, tmp_path):
    """What the fault tests load back is the network saved, not just any array file."""
    directory = fresh(base, tmp_path, 'values')
    save_epoch_two(directory)
    state = gm.Checkpointer(directory, CONFIG).load()
    net, trainer = tiny(seed=3)
    state.restore(net, trainer, [mx.cpu()])
    for a, b in zip(net.collect_params().values(), tiny(seed=1)[0].collect_params().values()):
        onp.testing.assert_array_equal(a.data().asnumpy(), b.data().asnumpy())


def own_and_decoys(directory):
    """The names a settled directory may hold: the checkpoint's, the decoys' tops (no lock)."""
    state = gm.Checkpointer(directory, CONFIG, resume=True).load()
    own = {'manifest.json', *(e['name'] for e in state.manifest['files'].values())}
    return state.epoch, own | {name.split('/')[0] for name in DECOYS}


@pytest.mark.parametrize('code', [errno.ENOSPC, errno.EIO], ids=['ENOSPC', 'EIO'])
def test_a_failed_save_leaves_nothing_of_its_own_before_the_next_one(base, tmp_path, code):
    """A fault at any one call (the fsync of the folder and the removals after the new manifest
    included) leaves the old checkpoint or the new one and no save folder, with no reopening."""
    calls = count_calls(base, tmp_path)
    for n in range(1, calls + 1):
        directory = fresh(base, tmp_path, f'settled-{n}')

        failed_save(directory, n, code)
        _, names = own_and_decoys(directory)
        assert sorted(os.listdir(directory)) == sorted(names), n


def test_recover_alone_settles_what_a_killed_save_left(base, tmp_path):
    """``checkpoint.recover``: after a kill at any call, the old checkpoint byte for byte or the
    new one, no save folder and no lock left, the user's files as they were."""
    calls = count_calls(base, tmp_path)
    for n in range(1, calls + 1):
        directory = fresh(base, tmp_path, f'recover-{n}')
        # the lock taken before the faults begin: a lock to leave stale
        status = save_killed_at(n, directory,
                                holding=lambda: gm.Checkpointer(directory, CONFIG, resume=True))
        assert os.WIFSIGNALED(status), (n, status)
        gm.checkpoint.recover(directory)
        epoch, names = own_and_decoys(directory)
        assert sorted(os.listdir(directory)) == sorted(names), n
        after = snapshot(directory)
        assert all(after[name] == data for name, data in DECOYS.items()), n
        if epoch == 1:
            assert after == base[1], n


def test_recover_leaves_a_running_save_alone(base, tmp_path):
    """While a run holds the directory, ``recover`` removes nothing (its save folder is live)."""
    directory = fresh(base, tmp_path, 'busy')
    with gm.Checkpointer(directory, CONFIG, resume=True):
        live = gm.savefolder.make(str(directory))
        with pytest.raises(gm.CheckpointError, match='another run is using'):
            gm.checkpoint.recover(directory)
        assert os.path.isdir(live)
    assert gm.checkpoint.recover(directory) == [os.path.basename(live)]
    assert not os.path.exists(live)


def test_opening_an_existing_directory_creates_nothing_but_the_lock(base, tmp_path):
    """No probe file (killed, it would be left, unrecognisable): the lock tests writability."""
    directory = fresh(base, tmp_path, 'open')
    counter = Counter()
    fs.hook = counter
    try:
        with gm.Checkpointer(directory, CONFIG, resume=True):
            pass
    finally:
        fs.hook = None
    # The lock's content is written to an unnamed file made in the folder (an 'open' of the
    # folder itself), then linked as .lock: no other name is ever created.
    named = {name for op, name in counter.calls if op != 'open'}
    opened = {name for op, name in counter.calls if op == 'open'}
    assert named == {'.lock'} and opened <= {'.lock', 'open'}, counter.calls

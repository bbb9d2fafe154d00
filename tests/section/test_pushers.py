"""machinery.pushers: each CPU context's passes queued from a thread of its own, same figures."""
import os
import threading

import pytest

import gluon_multigpu as gm
from gluon_multigpu.machinery.pushers import DevicePushers, pushers_for


def test_the_first_call_of_a_kind_runs_in_the_caller_and_later_ones_in_each_devices_thread():
    devices = gm.cpu_devices(2)
    where = []

    def call(i):
        return lambda: where.append((i, threading.current_thread().name)) or i * 10
    with DevicePushers(devices) as pushers:
        assert pushers.run([call(0), call(1)], 'train') == [0, 10]
        first = list(where)
        where.clear()
        assert pushers.run([call(0), call(1)], 'train') == [0, 10]
        later = sorted(where)
        where.clear()
        assert pushers.run([call(0)], 'eval') == [0]  # a new kind: the caller again
        eval_first = list(where)
    me = threading.current_thread().name
    assert first == [(0, me), (1, me)]  # builds the graphs one thread at a time
    assert later == [(0, 'push-cpu(0)'), (1, 'push-cpu(1)')]
    assert eval_first == [(0, me)]


def test_each_device_has_one_thread_for_the_process_whoever_asks():
    # MXNet keeps a thread's scratch copies until the process ends: a thread per training left
    # about 1.1 GB of ResNet-18's behind at each call (pushers' text)
    devices = gm.cpu_devices(2)
    with DevicePushers(devices) as first:
        threads = list(first.threads)
    assert all(t.is_alive() for t in threads)  # kept for the next training
    with DevicePushers(devices[::-1]) as second:
        assert second.threads == threads[::-1]
    assert gm.pushers.device_thread(devices[0]) is threads[0]


def test_two_trainings_at_once_each_get_their_own_results():
    devices = gm.cpu_devices(2)
    gate = threading.Barrier(2, timeout=10)
    outcomes = {}

    def use(tag):
        with DevicePushers(devices) as pushers:
            pushers.warm.add('train')
            gate.wait()
            outcomes[tag] = [pushers.run([lambda i=i: (tag, i), lambda i=i: (tag, -i)], 'train')
                             for i in range(50)]
    users = [threading.Thread(target=use, args=(tag,)) for tag in 'ab']
    for t in users:
        t.start()
    for t in users:
        t.join(30)
    for tag in 'ab':
        assert outcomes[tag] == [[(tag, i), (tag, -i)] for i in range(50)]


def test_a_forked_child_makes_threads_of_its_own():
    devices = gm.cpu_devices(2)
    parent = gm.pushers.device_thread(devices[0])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's threads are not running here
        try:
            pushers = DevicePushers(devices)
            pushers.warm.add('train')
            ok = pushers.run([lambda: 1, lambda: 2], 'train') == [1, 2] and \
                pushers.threads[0] is not parent
            os.write(write, b'1' if ok else b'0')
        finally:
            os._exit(0)  # pylint: disable=protected-access
    os.close(write)
    try:
        assert os.read(read, 1) == b'1'
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_a_call_that_raises_is_raised_once_every_call_has_ended():
    devices = gm.cpu_devices(2)
    ended = threading.Event()

    def fails():
        raise ValueError('shard 0')

    def slow():
        ended.wait(5)
        return 'done'
    with DevicePushers(devices) as pushers:
        pushers.warm.add('train')
        ended.set()
        with pytest.raises(ValueError, match='shard 0'):
            pushers.run([fails, slow], 'train')
        assert pushers.run([lambda: 1, lambda: 2], 'train') == [1, 2]  # still usable


def test_only_several_cpu_contexts_get_threads():
    with pushers_for(gm.cpu_devices(1)) as none:
        assert none is None
    with pushers_for(gm.cpu_devices(2)) as pushers:
        assert isinstance(pushers, DevicePushers) and len(pushers.threads) == 2


def test_training_on_two_contexts_queues_from_their_threads_and_leaves_no_other():
    devices = gm.cpu_devices(2)
    tr, te = gm.data.synthetic_data('fashion-mnist', 8, num_train=32, num_test=16, num_devices=2)
    seen = set()

    class Spy(gm.Hook):
        def step_end(self, run, step, samples, timer):  # pylint: disable=unused-argument
            seen.update(t.name for t in threading.enumerate())
    before = {t.name for t in threading.enumerate()}
    result = gm.train(gm.simple_cnn(), tr, te, devices, num_epochs=1, hooks=[Spy()])
    assert {'push-cpu(0)', 'push-cpu(1)'} <= seen
    # no thread but the devices' (made once for the process) outlives the training
    assert {t.name for t in threading.enumerate()} <= before | {'push-cpu(0)', 'push-cpu(1)'}
    gm.train(gm.simple_cnn(), tr, te, devices, num_epochs=1)
    assert sum(t.name == 'push-cpu(0)' for t in threading.enumerate()) == 1
    assert len(result.epochs) == 1


def test_a_training_that_nothing_holds_is_freed_when_the_next_one_starts():
    import weakref  # pylint: disable=import-outside-toplevel
    devices = gm.cpu_devices(2)
    tr, te = gm.data.synthetic_data('fashion-mnist', 8, num_train=16, num_test=8, num_devices=2)
    net = gm.simple_cnn()
    first = weakref.ref(net)
    gm.train(net, tr, te, devices, num_epochs=1)
    del net  # the training and its result refer to each other: only a collection frees them
    gm.train(gm.simple_cnn(), tr, te, devices, num_epochs=1)
    assert gm.last_run().net is not None
    assert first() is None  # the first network went with its training

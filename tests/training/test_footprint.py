"""What the package changes in the process it runs in, against the guide's one list of it
(docs/guide.md, "What the package changes in your process").

A fresh process notes its environment, root logger, threads, signal handlers and
NumPy's names, makes two CPU contexts and trains a few hundred images for one
epoch, notes them again, then has ``logging.basicConfig`` set up logging as a
user would: everything that changed must be in the guide's list, and each
change the list names must be found.
"""
import json
import re
import sys
import textwrap

import numpy as onp
import pytest

from conftest import REPO, run_bounded
from gluon_multigpu.base import compat

SCRIPT = textwrap.dedent('''
    import json, logging, os, signal, sys, threading, types
    import numpy

    def name(signum):
        try:
            return signal.Signals(signum).name
        except ValueError:
            return str(signum)

    def wakeup_fd():  # the descriptor a signal is written to (signal.set_wakeup_fd), -1: none
        fd = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(fd)
        return fd

    def snapshot():
        return {
            'environ': dict(os.environ),
            'root_handlers': [repr(h) for h in logging.getLogger().handlers],
            'threads': sorted(t.name for t in threading.enumerate()),
            'signals': dict({name(s): repr(signal.getsignal(s)) for s in signal.valid_signals()
                             if s not in (signal.SIGKILL, signal.SIGSTOP)},
                            wakeup_fd=wakeup_fd()),
            'numpy': sorted(n for n, v in vars(numpy).items()
                            if not isinstance(v, types.ModuleType)),  # not its submodules
        }

    before = snapshot()
    import gluon_multigpu as gm
    devices = gm.cpu_devices(2)
    made = snapshot()
    train_iter, test_iter = gm.data.synthetic_data('fashion-mnist', 64, num_train=320,
                                                  num_test=64)
    gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=1)
    after = snapshot()
    logging.basicConfig(level=logging.DEBUG, format='user-format %(levelname)s %(message)s')
    logging.debug('a debug line of the user')
    print(json.dumps({'before': before, 'made': made, 'after': after,
                      'restored': gm.base.compat.report()['numpy_names']}))
''')


@pytest.fixture(scope='module')
def footprint():
    # the package's engine settings are not the test suite's: a process as a user starts it
    env = {k: v for k, v in __import__('os').environ.items()
           if k not in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY', 'OMP_WAIT_POLICY')}
    proc = run_bounded([sys.executable, '-c', SCRIPT], timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    found['stderr'] = proc.stderr
    return found


def changes(found, later='after'):
    """What changed from ``before`` to ``later``, by kind: names (sets) and the root's handlers."""
    before, after = found['before'], found[later]
    return {
        'environment variables': {k for k in set(before['environ']) | set(after['environ'])
                                  if before['environ'].get(k) != after['environ'].get(k)},
        'NumPy names': set(after['numpy']) - set(before['numpy']),
        'threads': set(after['threads']) - set(before['threads']),
        'signal handlers': {s for s in after['signals']
                            if before['signals'].get(s) != after['signals'][s]},
        'root logger handlers': set(after['root_handlers']) ^ set(before['root_handlers']),
    }


def guide_list():
    """The guide's list: its kind (the bold words each item starts with) -> the names its first
    sentence gives in backquotes (none where it says none), and that sentence."""
    text = (REPO / 'docs' / 'guide.md').read_text(encoding='utf-8')
    section = text.split('### What the package changes in your process\n', 1)[1]
    section = section.split('\n#', 1)[0]
    items = re.findall(r'^- \*\*([^*]+)\*\*(.*?)(?=^- \*\*|^\S|\Z)', section, re.M | re.S)
    listed = {}
    for kind, body in items:
        first = ' '.join(body.split()).lstrip(': ').split('. ', 1)[0]
        listed[kind.strip(' :').lower()] = (set(re.findall(r'`([^`]+)`', first)), first)
    return listed


def test_the_root_logger_is_left_as_found_and_basicconfig_takes_effect(footprint):
    assert footprint['made']['root_handlers'] == footprint['before']['root_handlers'] == []
    assert footprint['after']['root_handlers'] == []
    assert 'user-format DEBUG a debug line of the user' in footprint['stderr'].splitlines()


def test_the_guide_lists_every_change_a_training_makes_and_nothing_it_does_not(footprint):
    listed = guide_list()
    kinds = {kind.lower() for kind in changes(footprint)}
    assert kinds <= set(listed), sorted(set(listed))
    for kind, found in changes(footprint).items():
        names, text = listed[kind.lower()]
        if kind == 'NumPy names':  # this NumPy's share of the names the list gives
            assert found == set(footprint['restored']) and found <= names, (found, names)
        elif kind == 'threads':  # one per CPU context, named for it
            assert found == {'push-cpu(0)', 'push-cpu(1)'} and 'push-cpu(N)' in names, text
        else:
            assert found == names, (kind, found, names)
    # made with the devices already: the variables, before MXNet loaded
    assert changes(footprint, 'made')['environment variables'] == \
        listed['environment variables'][0]


def test_the_guides_list_is_read_as_written():
    listed = guide_list()
    assert listed['environment variables'][0] == {'OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY'}
    assert listed['signal handlers'] == (set(), 'none')
    assert listed['root logger handlers'] == (set(), 'none')
    # every name base.compat may set, whichever NumPy this is (trapz: where NumPy has trapezoid)
    may_set = set(compat._replacements(onp))  # pylint: disable=protected-access
    assert may_set | {'trapz'} <= listed['numpy names'][0]
    assert 'not checked by the test' in listed

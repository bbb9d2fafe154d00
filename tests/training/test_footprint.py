"""What the package changes in the process it runs in.

A fresh process notes its environment, root logger, threads, signal handlers and
NumPy's names, makes two CPU contexts and trains a few hundred images for one
epoch, notes them again, then has ``logging.basicConfig`` set up logging as a
user would.
"""
import json
import sys
import textwrap

import pytest

from conftest import REPO, run_bounded

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


def test_the_root_logger_is_left_as_found_and_basicconfig_takes_effect(footprint):
    assert footprint['made']['root_handlers'] == footprint['before']['root_handlers'] == []
    assert footprint['after']['root_handlers'] == []
    assert 'user-format DEBUG a debug line of the user' in footprint['stderr'].splitlines()

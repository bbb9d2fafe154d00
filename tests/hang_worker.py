"""scripts/train.py with one step that never ends, for the stall tests: a test's program only.

``GLUON_MULTIGPU_TEST_HANG=STEP`` (or ``RANK:STEP``) makes the ``STEP``-th call of
``Trainer.step`` (of the parameter-server worker of rank ``RANK``; 0 without one)
block for good, inside the step, before its gradients go out: the other workers of a
synchronous job then wait for them. It says so on standard output first
(``test hang: rank R blocks in step S``). The rest is train.py as it is::

    GLUON_MULTIGPU_TEST_HANG=1:3 python tests/hang_worker.py --kvstore dist_sync ...
"""
import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import time

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'scripts',
                     'train.py')


def hang_at():
    """``(rank, step)`` from the variable."""
    rank, _, step = os.environ['GLUON_MULTIGPU_TEST_HANG'].rpartition(':')
    return int(rank or 0), int(step)


def wrap(trainer_class, rank, step):
    """Make ``trainer_class.step`` block in its ``step``-th call on ``rank``."""
    original, calls = trainer_class.step, [0]

    def stepping(self, *args, **kwargs):
        calls[0] += 1
        kv = getattr(self, '_kvstore', None)
        if calls[0] == step and getattr(kv, 'rank', 0) == rank:
            print(f'test hang: rank {rank} blocks in step {step}', flush=True)
            while True:
                time.sleep(3600)
        return original(self, *args, **kwargs)
    trainer_class.step = stepping


class PatchTrainer(importlib.abc.MetaPathFinder):
    """Wraps ``Trainer.step`` as ``mxnet.gluon.trainer`` loads (after the engine is set up)."""

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        if name != 'mxnet.gluon.trainer':
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            wrap(module.Trainer, *hang_at())
        spec.loader.exec_module = exec_module
        return spec


if __name__ == '__main__':
    sys.meta_path.insert(0, PatchTrainer())
    sys.argv = [TRAIN, *sys.argv[1:]]
    runpy.run_path(TRAIN, run_name='__main__')

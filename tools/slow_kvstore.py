"""The train program with one kvstore made slower by a known amount: a sleep in each of its steps.

    python tools/slow_kvstore.py device 0.015 --cpu-devices 2 --kvstore local device ...

A maintainer's tool, not part of the package: the known answer for a kvstore comparison on a
real machine (issue 39's trial, docs/results.md "Comparisons on a shared machine"). The sleep
is inside the timed epoch (a hook's ``step_end``), so that kvstore's epochs take longer by the
sleep times its steps; everything else is ``scripts/train.py``'s, flags and all.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

import gluon_multigpu as gm  # noqa: E402
from gluon_multigpu.cli import train  # noqa: E402
from gluon_multigpu.runs import kvstore_run  # noqa: E402


def main():
    if len(sys.argv) < 3:
        print('usage: slow_kvstore.py KVSTORE SECONDS [train.py flags ...]', file=sys.stderr)
        return 2
    slow, seconds = sys.argv[1], float(sys.argv[2])

    class Sleep(gm.Hook):
        def step_end(self, run, step, samples, timer):
            time.sleep(seconds)

    built = kvstore_run.Training

    def training(*args, hooks=(), kvstore='device', **kwargs):
        extra = [Sleep()] if kvstore == slow else []
        return built(*args, hooks=[*hooks, *extra], kvstore=kvstore, **kwargs)
    kvstore_run.Training = training
    sys.argv = ['train.py', *sys.argv[3:]]
    train.start()
    return 0


if __name__ == '__main__':
    sys.exit(main())

#!/usr/bin/env python3
"""Start a training on MXNet's parameter server: scheduler, servers and workers, supervised.

Starts the program ``gluon_multigpu.cli.launch`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-launch`` does where the package is installed.
"""
from gluon_multigpu.cli import launch

if __name__ == '__main__':
    launch.start(__file__)

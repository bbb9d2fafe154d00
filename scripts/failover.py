#!/usr/bin/env python3
"""Measure what each fault costs a training job on a cluster: detection, recovery, what is left.

Starts the program ``gluon_multigpu.cli.failover`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-failover`` does where the package is installed.
"""
from gluon_multigpu.cli import failover

if __name__ == '__main__':
    failover.start(__file__)

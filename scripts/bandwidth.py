#!/usr/bin/env python3
"""Measure what one gradient synchronisation costs, against the compute of one training step.

Starts the program ``gluon_multigpu.cli.bandwidth`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-bandwidth`` does where the package is installed.
"""
from gluon_multigpu.cli import bandwidth

if __name__ == '__main__':
    bandwidth.start(__file__)

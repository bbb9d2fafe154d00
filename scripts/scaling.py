#!/usr/bin/env python3
"""Sweep device counts, batch sizes, learning-rate rules, kvstores: speed and accuracy on k devices.

Starts the program ``gluon_multigpu.cli.scaling`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-scaling`` does where the package is installed.
"""
from gluon_multigpu.cli import scaling

if __name__ == '__main__':
    scaling.start(__file__)

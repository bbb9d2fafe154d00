#!/usr/bin/env python3
"""Check that this machine can train: Python, NumPy, MXNet and its build, devices, a two-context step.

Starts the program ``gluon_multigpu.doctor`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-doctor`` does where the package is installed.
"""
from gluon_multigpu import doctor

if __name__ == '__main__':
    doctor.start(__file__)

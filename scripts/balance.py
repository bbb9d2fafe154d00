#!/usr/bin/env python3
"""Measure even, weighted and auto splits of each batch on devices made unequal by other work.

Starts the program ``gluon_multigpu.cli.balance`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-balance`` does where the package is installed.
"""
from gluon_multigpu.cli import balance

if __name__ == '__main__':
    balance.start(__file__)

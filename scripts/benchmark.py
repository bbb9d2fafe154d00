#!/usr/bin/env python3
"""Measure the package's training path against the text's loop, side by side, in one run.

Starts the program ``gluon_multigpu.cli.benchmark`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-benchmark`` does where the package is installed.
"""
from gluon_multigpu.cli import benchmark

if __name__ == '__main__':
    benchmark.start(__file__)

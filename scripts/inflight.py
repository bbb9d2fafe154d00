#!/usr/bin/env python3
"""Measure training speed and peak memory against the steps allowed in flight (--max-in-flight).

Starts the program ``gluon_multigpu.cli.inflight`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-inflight`` does where the package is installed.
"""
from gluon_multigpu.cli import inflight

if __name__ == '__main__':
    inflight.start(__file__)

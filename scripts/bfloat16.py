#!/usr/bin/env python3
"""Measure training in bfloat16 against float32 on one CPU context: the evidence behind --dtype.

Starts the program ``gluon_multigpu.cli.bfloat16`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-bfloat16`` does where the package is installed.
"""
from gluon_multigpu.cli import bfloat16

if __name__ == '__main__':
    bfloat16.start(__file__)

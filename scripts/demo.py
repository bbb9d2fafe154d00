#!/usr/bin/env python3
"""Walk through d2l 13.6 on two devices, printing what the text prints.

Starts the program ``gluon_multigpu.cli.demo`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-demo`` does where the package is installed.
"""
from gluon_multigpu.cli import demo

if __name__ == '__main__':
    demo.start(__file__)

#!/usr/bin/env python3
"""Train the book's ResNet-18 (or the lab's simple CNN) data-parallel on several devices.

Starts the program ``gluon_multigpu.cli.train`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-train`` does where the package is installed.
"""
from gluon_multigpu.cli import train

if __name__ == '__main__':
    train.start(__file__)

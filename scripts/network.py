#!/usr/bin/env python3
"""Measure parameter-server steps on a cluster with shaped links, beside the network model.

Starts the program ``gluon_multigpu.cli.network`` from the checkout (``--help`` says what it
does), as the console script ``gluon-multigpu-network`` does where the package is installed.
"""
from gluon_multigpu.cli import network

if __name__ == '__main__':
    network.start(__file__)

#!/usr/bin/env python3
"""Measure parameter-server steps on a cluster with shaped links, beside the network model.

Starts the lab's program ``lab.commands.network`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import network  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    network.start(__file__)

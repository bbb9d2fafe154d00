#!/usr/bin/env python3
"""Sweep device counts, batch sizes, learning-rate rules, kvstores: speed and accuracy on k devices.

Starts the lab's program ``lab.commands.scaling`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import scaling  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    scaling.start(__file__)

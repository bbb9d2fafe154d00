#!/usr/bin/env python3
"""Measure the package's training path against the text's loop, side by side, in one run.

Starts the lab's program ``lab.commands.benchmark`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import benchmark  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    benchmark.start(__file__)

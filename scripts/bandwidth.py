#!/usr/bin/env python3
"""Measure what one gradient synchronisation costs, against the compute of one training step.

Starts the lab's program ``lab.commands.bandwidth`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import bandwidth  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    bandwidth.start(__file__)

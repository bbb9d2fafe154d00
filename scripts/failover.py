#!/usr/bin/env python3
"""Measure what each fault costs a training job on a cluster: detection, recovery, what is left.

Starts the lab's program ``lab.commands.failover`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import failover  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    failover.start(__file__)

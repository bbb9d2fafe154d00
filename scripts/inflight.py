#!/usr/bin/env python3
"""Measure training speed and peak memory against the steps allowed in flight (--max-in-flight).

Starts the lab's program ``lab.commands.inflight`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import inflight  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    inflight.start(__file__)

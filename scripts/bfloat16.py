#!/usr/bin/env python3
"""Measure training in bfloat16 against float32 on one CPU context: the evidence behind --dtype.

Starts the lab's program ``lab.commands.bfloat16`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import bfloat16  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    bfloat16.start(__file__)

#!/usr/bin/env python3
"""Measure even, weighted and auto splits of each batch on devices made unequal by other work.

Starts the lab's program ``lab.commands.balance_study`` from this checkout (``--help`` says what it
does): the lab is not installed with the package.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from lab.commands import balance_study  # noqa: E402  (the checkout's lab, found above)

if __name__ == '__main__':
    balance_study.start(__file__)

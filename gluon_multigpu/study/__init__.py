"""Measuring and comparing: timings, scaling, kvstores side by side, charts and reports."""

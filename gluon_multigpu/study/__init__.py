"""Kvstores side by side: ``compare`` (the answer), ``paired`` (interleaved rounds, ratios and
their intervals, the load), ``kvstore_report`` and ``charts``."""

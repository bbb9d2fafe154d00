"""The lab's programs, each started from a checkout as ``python scripts/NAME.py``: ``scaling``,
``bandwidth``, ``balance_study`` (scripts/balance.py), ``bfloat16``, ``inflight``,
``benchmark`` (with ``bench_workers``), ``network``, ``failover``; ``sweeps`` holds the mains
of those that keep their measurements as they go."""

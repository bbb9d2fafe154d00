"""The machine a measurement ran on and the day it was made, as results files record them.

Every results file a study writes (``runs.json``, ``balance.csv``,
``bandwidth.csv``, ``scaling.csv``, ...) carries ``machine`` and ``date``
beside its figures, so that a figure quoted in the docs says where and when
it was measured (``tools/figures.py`` checks the docs against these files).
"""
import contextlib
import datetime
import functools
import os
import platform

__all__ = ['machine', 'cpu_flags', 'stamp']


@functools.lru_cache(maxsize=None)
def _cpuinfo():
    """The first CPU's /proc/cpuinfo fields by lower-case name (none where the system has no
    such file); read once a process (every results file a study writes is stamped)."""
    fields = {}
    with contextlib.suppress(OSError), open('/proc/cpuinfo') as f:
        for line in f:
            if not line.strip():
                break  # the first CPU's block ends here
            name, _, value = line.partition(':')
            fields.setdefault(name.strip().lower(), value.strip())
    return fields


def cpu_flags():
    """The CPU's instruction-set flags, as /proc/cpuinfo lists them (none where it does not)."""
    return frozenset(_cpuinfo().get('flags', '').split())


#: The widest vector instructions a CPU has, by /proc/cpuinfo's flag, widest first: the
#: kernels oneDNN picks (a model name such as "AMD EPYC" can be a CPU with any of them).
VECTORS = (('amx_bf16', 'AMX'), ('avx512_bf16', 'AVX512-BF16'), ('avx512f', 'AVX-512'),
           ('avx2', 'AVX2'))


def machine():
    """This machine's CPU (its model name, as ``lscpu`` names it: /proc/cpuinfo's, else the
    platform's), its widest vector instructions (``VECTORS``; None where it lists none of them)
    and its cores."""
    cpu = _cpuinfo().get('model name') or platform.processor() or platform.machine() or 'unknown'
    vectors = next((name for flag, name in VECTORS if flag in cpu_flags()), None)
    return {'cpu': cpu, 'vectors': vectors, 'cores': os.cpu_count()}


def stamp():
    """``{'machine': 'CPU (VECTORS), N cores', 'date': 'YYYY-MM-DD'}`` (UTC) for a results file
    made now."""
    m = machine()
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    vectors = f" ({m['vectors']})" if m['vectors'] else ''
    return {'machine': f"{m['cpu']}{vectors}, {m['cores']} cores", 'date': today}


"""What a long run will cost before it starts: durations and sizes in words, and the memory check.

A study (``sweep.Sweep``) says how long it will take and refuses, or scales
down, what would not fit in memory. Nothing here loads MXNet; the library reads
no environment: the memory available is passed in.
"""
from gluon_multigpu.base.units import duration
from gluon_multigpu.errors import DeviceError

__all__ = ['duration', 'size', 'check_memory', 'fit_to_memory']


def size(num_bytes):
    """``num_bytes`` as ``1.2 GB`` or ``350 MB`` (1 GB = 1e9 bytes)."""
    return f'{num_bytes / 1e9:.1f} GB' if num_bytes >= 1e9 else f'{num_bytes / 1e6:.0f} MB'


def check_memory(need, available, what, fix):
    """Raise ``DeviceError`` when ``need`` bytes (an estimate) exceed ``available``.

    ``what`` names the measurement (``ResNet-18 on 4 CPU contexts, 64 per
    context``), ``fix`` what to give instead. ``available`` None (the system
    does not say): no check.
    """
    if available is not None and need > available:
        raise DeviceError(f'{what} needs about {size(need)} of memory and {size(available)} is '
                          f'available; {fix}')


def fit_to_memory(batch, need, available, what, flag, otherwise, given, say, doing):
    """The largest of ``batch``, ``batch // 2``, ``batch // 4`` ... whose ``need(b)`` bytes fit.

    ``batch`` itself when it fits (or ``available`` is None). A batch the user
    gave (``given``), or one that does not fit even halved down to 1, is
    refused (``DeviceError``: use ``flag`` FITS or less, or ``otherwise``);
    a default is halved with a line to ``say`` (``...: DOING instead``, ``doing`` a
    format of the batch that fits, such as ``'measuring {} per device'``).
    """
    if available is None or need(batch) <= available:
        return batch
    fits = batch
    while fits > 1 and need(fits) > available:
        fits //= 2
    if given or need(fits) > available:
        check_memory(need(batch), available, what,
                     f'use {flag} {fits} or less' if need(fits) <= available else otherwise)
    say(f'note: {what} would need about {size(need(batch))} of memory and {size(available)} '
        f'is available: {doing.format(fits)} instead')
    return fits

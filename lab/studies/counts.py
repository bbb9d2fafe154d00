"""The device counts of a study's sweep: which type, which counts, and their devices."""
from gluon_multigpu.section.devices import gpu_devices, num_gpus
from gluon_multigpu.errors import DeviceError

__all__ = ['device_counts', 'resolve_counts', 'devices_for']


def device_counts(max_count, minimum=1):
    """Return the counts of a sweep: 1, 2, 4, ... up to ``max_count``, and ``max_count``.

    Counts below ``minimum`` are left out (a synchronisation needs two devices).
    """
    counts, n = [], 1
    while n <= max_count:
        if n >= minimum:
            counts.append(n)
        n *= 2
    if max_count >= minimum and max_count not in counts:
        counts.append(max_count)
    return counts


def resolve_counts(num_gpus_wanted=None, cpu_devices_wanted=None, counts=None, minimum=1,
                   cpu_default=(1,)):
    """Decide the device type and the device counts of a sweep.

    (More: lab/NOTES.md.)
    """
    counts = sorted(set(counts)) if counts else None
    if counts and counts[0] < minimum:
        raise DeviceError(f'a gradient synchronisation needs at least {minimum} devices, got a '
                          f'count of {counts[0]}; give `counts` of {minimum} or more')
    for name, wanted in (('cpu_devices', cpu_devices_wanted), ('num_gpus', num_gpus_wanted)):
        if wanted is None:
            continue
        if name == 'num_gpus':
            gpu_devices(wanted)  # raises, naming how many exist, if fewer do
        if counts and counts[-1] > wanted:
            raise DeviceError(f'`counts` {counts[-1]} exceeds `{name}` {wanted}; raise '
                              f'`{name}` or leave the count out')
        chosen = counts or device_counts(wanted, minimum)
        if not chosen:
            raise DeviceError(f'`{name}` {wanted} gives no device count of at least {minimum}; '
                              f'use `{name}` {minimum} or more')
        return ('cpu' if name == 'cpu_devices' else 'gpu'), chosen, None
    available = num_gpus()
    if available:
        if counts:
            gpu_devices(counts[-1])
            return 'gpu', counts, None
        chosen = device_counts(available, minimum)
        if not chosen:
            raise DeviceError(f'only {available} GPU is available and this needs at least '
                              f'{minimum} devices; use `cpu_devices` {2 * minimum} to measure '
                              'CPU contexts instead')
        return 'gpu', chosen, None
    chosen = counts or sorted(cpu_default)
    return 'cpu', chosen, (f'no GPU found: using CPU contexts, counts {", ".join(map(str, chosen))}'
                           '; `cpu_devices` N sets the largest count')


def devices_for(device_type, n):
    """Return the first ``n`` devices of ``device_type`` (``'gpu'`` or ``'cpu'``)."""
    if device_type == 'gpu':
        return gpu_devices(n)
    from gluon_multigpu import _mxnet  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    return [mx.cpu(i) for i in range(n)]

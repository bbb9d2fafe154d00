"""MXNet's profiler dumps read, and turned into the trace ``Profile`` writes: a track per device
named as the package names it, and the table of the costliest operators. Plain Python: no
MXNet is loaded here.
"""
import json
import re

__all__ = ['read_events', 'device_trace', 'costliest', 'cost_table']


def read_events(text):
    """The events of one dump of MXNet's profiler (``text``), as a list of dicts.

    The process's first dump opens the JSON (``{"traceEvents": [``), the later ones continue
    it (``,`` and events); the last, at the process's end, closes it. Any of them is read.
    """
    body = text.strip()
    if body.startswith('{'):
        body = body[body.index('[') + 1:]
    if end := re.search(r'\]\s*,\s*"displayTimeUnit"\s*:\s*"\w+"\s*\}\s*$', body):
        body = body[:end.start()]
    body = body.strip().strip(',')
    return json.loads(f'[{body}]')


def _label(name):
    """The package's name of MXNet's device ``name``: ``cpu/0`` is ``cpu(0)``."""
    return re.sub(r'\A(cpu|gpu)/(\d+)\Z', r'\1(\2)', name).rstrip('/')


def device_trace(events, devices, cpus, gpus=0):
    """A Chrome trace (a dict) of MXNet's ``events``, one process per device.

    ``devices`` (their names, ``'cpu(0)'``) come first, in order, each a process even if idle;
    then MXNet's other devices, then the host (MXNet's C API calls). Left out: MXNet's
    ``operator`` domain, a copy of every device's operators without their device. Memory
    counters go to their device's process. Process, thread and async ids become small
    numbers (MXNet's 64-bit hashes are beyond what a browser's JSON keeps exact).
    ``cpus``/``gpus``: the devices MXNet's profiler knows (``engine.cores()``; 32
    GPUs in a CUDA build).
    """
    # MXNet's device numbers -> the package's names: from the dump's process names where it has
    # them (the process's first dump), else from MXNet's order (CPUs, GPUs, pinned, shared)
    names = {e.get('pid'): e.get('args', {}).get('name', '') for e in events
             if e.get('ph') == 'M' and e.get('name') == 'process_name'}
    order = [*(f'cpu/{i}' for i in range(cpus)), *(f'gpu/{i}' for i in range(gpus)),
             'cpu pinned/', 'cpu shared/']
    labels = {index: _label(names.get(index, name)) for index, name in enumerate(order)}
    pids = {name: i for i, name in enumerate(devices)}
    tids, ids, out = {}, {}, []
    for e in events:
        if e.get('ph') == 'M':
            continue
        label = labels.get(e.get('pid')) if isinstance(e.get('pid'), int) else None
        if label is None:  # one of MXNet's domains, by its category
            label = {'MXNET_C_API': 'host: MXNet C API'}.get(e.get('cat'), e.get('cat'))
            if label == 'operator':
                continue
            memory = re.fullmatch(r'Memory: (.+)', e.get('name', ''))
            if label == 'Device Storage' and memory:
                label = _label(memory.group(1))
                e = dict(e, name='memory', args={'memory': v for v in e.get('args', {}).values()})
        pid = pids.setdefault(label, len(pids))
        tid = tids.setdefault((pid, e.get('tid')), sum(p == pid for p, _ in tids) + 1)
        e = dict(e, pid=pid, tid=tid)
        if 'id' in e:
            e['id'] = ids.setdefault(e['id'], len(ids) + 1)
        out.append(e)
    meta = [m for label, pid in pids.items() for m in (
        {'ph': 'M', 'name': 'process_name', 'pid': pid, 'args': {'name': label}},
        {'ph': 'M', 'name': 'process_sort_index', 'pid': pid, 'args': {'sort_index': pid}})]
    label = {pid: name for name, pid in pids.items()}
    meta += [{'ph': 'M', 'name': 'thread_name', 'pid': pid, 'tid': tid,
              'args': {'name': f'{label[pid]} thread {tid}'}} for (pid, _), tid in tids.items()]
    return {'traceEvents': meta + out, 'displayTimeUnit': 'ms'}


def costliest(trace, count=10):
    """The ``count`` operators of ``trace`` (``device_trace``'s) that took longest, all devices
    together: ``[(name, calls, milliseconds, share of all operators' time)]``, costliest first."""
    started, totals = {}, {}
    for e in trace['traceEvents']:
        if e.get('cat') != 'operator':
            continue
        key, phase = (e.get('pid'), e.get('tid')), e.get('ph')
        if phase == 'B':
            started.setdefault(key, []).append(e)
            continue
        if phase == 'E' and started.get(key):
            begun = started[key].pop()
            name, took = begun.get('name'), e['ts'] - begun['ts']
        elif phase == 'X':
            name, took = e.get('name'), e.get('dur', 0)
        else:
            continue
        calls, total = totals.get(name, (0, 0))
        totals[name] = (calls + 1, total + took)
    whole = sum(total for _, total in totals.values())
    rows = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))[:count]
    return [(name, calls, total / 1000, total / whole if whole else 0.0)
            for name, (calls, total) in rows]


def cost_table(rows):
    """``costliest``'s rows as lines of text: operator, calls, total ms, share."""
    width = max([len('operator')] + [len(name) for name, *_ in rows])
    return [f'  {"operator":<{width}}  {"calls":>7}  {"total ms":>10}  {"share":>6}', *(
        f'  {name:<{width}}  {calls:>7}  {ms:>10.2f}  {share:>6.1%}'
        for name, calls, ms, share in rows)]

"""The registry of live clusters, and the removal of those whose creator died unclosed.

Each cluster is registered in ``REGISTRY`` as ``<name>.json`` (its
creator's process id and start time, its workdir) under the registry's lock
while it picks its subnet, so that clusters of several processes at once
never collide; ``remove_stale`` removes the clusters whose creating process
is gone (SIGKILL): their processes, namespaces, links, rule and temporary
workdir.
"""
import contextlib
import json
import os
import random
import re

from lab.hosts import netns
from lab.hosts.netns import ClusterError
from gluon_multigpu.errors import GluonMultiGPUError
from gluon_multigpu.filesafety import fs, reading
from gluon_multigpu.filesafety import lockfile
from gluon_multigpu.filesafety import output

__all__ = ['REGISTRY', 'remove_stale', 'reserve', 'live_workdirs']

#: Where each live cluster is registered (``<name>.json``: its creator's pid, start time, workdir).
REGISTRY = '/run/gluon-multigpu-clusters'


def remove_stale():
    """Remove every cluster whose creating process is gone; return their names.

    What ``Cluster()`` does first. Its processes are killed, its namespaces,
    links and rule deleted, its temporary workdir removed.
    """
    with _registry_lock():
        return _remove_stale_locked()


def reserve(workdir, own_workdir):
    """Remove stale clusters, pick a free 198.18.K.0/24 and register it under this process.

    Returns ``(K, path of the record)``; ``own_workdir``: ``workdir`` was made
    for the cluster alone (a stale one's is then removed whole).
    """
    with _registry_lock():
        _remove_stale_locked()
        taken = netns.taken_subnets(_registered())
        free = [k for k in range(1, 255) if k not in taken]
        if not free:
            raise ClusterError('no free 198.18.K.0/24 for a cluster: all 254 are in use')
        k = random.choice(free)
        record = {'pid': os.getpid(), 'start': _start_time(os.getpid()), 'workdir': workdir,
                  'remove_workdir': own_workdir}
        path = os.path.join(REGISTRY, f'{netns.PREFIX}{k}.json')
        output.create_exclusive(path, json.dumps(record).encode(), 0o644)
    return k, path


def live_workdirs():
    """The workdirs of the registered clusters whose creating process is alive."""
    found = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(REGISTRY)):
            if not entry.endswith('.json'):
                continue
            try:
                record = json.loads(reading.read_text(os.path.join(REGISTRY, entry), 1 << 20,
                                                      'cluster file'))
                start = _start_time(int(record['pid']))
                if start is not None and start == record['start']:
                    found.append(str(record['workdir']))
            except (OSError, ValueError, KeyError, TypeError, GluonMultiGPUError):
                continue
    return found


def _registry_lock(timeout=60.0):
    """The lock of the registry (``lockfile.Lock``, waiting up to ``timeout`` s for its holder)."""
    output.makedirs(REGISTRY, mode=0o755)
    return lockfile.Lock(os.path.join(REGISTRY, '.registry.lock'),
                      held=lambda who: f'the cluster registry {REGISTRY} stayed locked{who} for '
                                       f'{timeout:g} s',
                      fix=f'remove {REGISTRY} once no cluster runs', error=ClusterError,
                      wait=timeout)


def _registered():
    """The K of every registered cluster (``gmc<K>.json``)."""
    taken = set()
    for entry in os.listdir(REGISTRY):
        m = re.match(rf'^{netns.PREFIX}(\d+)\.json$', entry)
        if m:
            taken.add(int(m.group(1)))
    return taken


def _remove_stale_locked():
    removed = []
    for entry in sorted(os.listdir(REGISTRY)):
        if not entry.endswith('.json'):
            continue
        path = os.path.join(REGISTRY, entry)
        try:
            record = json.loads(reading.read_text(path, 1 << 20, 'cluster file'))
            start = _start_time(int(record['pid']))
            alive = start is not None and start == record['start']
        except (OSError, ValueError, KeyError, TypeError, GluonMultiGPUError):
            continue  # not a record of ours (or unreadable): left as it is
        if alive:
            continue
        name = entry[:-len('.json')]
        netns.remove(name)
        if record.get('remove_workdir') and isinstance(record.get('workdir'), str):
            # a folder mkdtemp made for that cluster alone (its record says so): all of it is its
            with contextlib.suppress(OSError):
                fs.remove_tree(record['workdir'])
        with contextlib.suppress(OSError):
            fs.unlink(path)  # a record of ours (it parsed as one), of a cluster now gone
        removed.append(name)
    return removed


def _start_time(pid):
    """The start time (clock ticks after boot) of live process ``pid``; None if gone or a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ('Z', 'X') else int(fields[19])

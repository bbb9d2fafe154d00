"""The entry points of the studies, the cluster and the data download, for the harness.

Their writers run with the cluster, the launcher and the network taken out (``patched``): the
failover study's rows and the network study's launcher are made up, ``ssh-keygen`` writes a
fixed key pair, the data comes from a ``file://`` mirror. See ``fault_entries``.
"""
import contextlib
import gzip
import io
import os
import struct
import subprocess

import gluon_multigpu as gm
from lab.studies import network_study
from fault_entries import Entry, patched, user_file, write_bytes

__all__ = ['ENTRIES']


# -- the studies' results -----------------------------------------------------------------------

def _failover_row(fault):
    return {'fault': fault, 'label': fault, 'fingerprint': 'ab12', 'equal': True, 'left': {},
            'cleared_s': 0.0, 'sshd_sessions': 0, 'duration_s': 12.5, 'detected_by': 'heartbeat',
            'detect_s': 1.0, 'restart_s': 2.0, 'recover_s': 3.0, 'lost_s': 4.0, 'restarts': 1,
            'hung': False, 'status': 0, 'injected_at': 'epoch 2', 'host_empty_s': 0.5,
            'load': [1.0], 'problems': []}


class FailoverResults(Entry):
    name, what = 'failover_results', '`scripts/failover.py` results (`lab/commands/failover.run`)'
    outputs = ('out',)

    def _run(self, root, faults):
        cli = __import__('lab.commands.failover', fromlist=['run'])
        args = cli.build_parser().parse_args(['--out', os.path.join(root, 'out')])
        rows = [_failover_row(f) for f in faults]
        with patched(cli, 'check', lambda args: '/data'), \
                patched(cli.failover, 'study', lambda *a, **k: iter(rows)), \
                patched(cli, 'machine', lambda: {'cpu': 'harness', 'cores': 2}), \
                contextlib.redirect_stdout(io.StringIO()):
            cli.run(args, ['--out', 'out'], say=lambda line: None)

    def previous(self, root):
        self._run(root, ['reference'])

    def decoys(self, root):
        return [user_file(root, 'out/notes.txt'), user_file(root, 'out/.results.json.z8x7c6v5.tmp')]

    def act(self, root):
        self._run(root, ['reference', 'kill-worker'])

    def partial_runs(self):
        return [lambda root: self._run(root, []), lambda root: self._run(root, ['reference'])]


class NetworkResults(Entry):
    name, what = 'network_results', '`scripts/network.py` results (`lab/commands/network._write`)'

    def _write(self, root, rows):
        cli = __import__('lab.commands.network', fromlist=['_write'])
        config = {'command': 'network.py --quick', 'machine': {'cpu': 'harness', 'cores': 2},
                  'date': '2026-01-01 00:00 UTC'}
        runs = [{'model': 'simple-cnn'}] * len(rows)
        cli._write(root, config, rows, runs)  # pylint: disable=protected-access

    def _rows(self, count):
        return [{c: None for c in network_study.ROW_COLUMNS} | {'model': 'simple-cnn', 'workers': 2,
                                                              'bandwidth': '1gbit', 'status': 'ok'}
                for _ in range(count)]

    def previous(self, root):
        self._write(root, self._rows(1))

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.results.md.r5t6y7u8.tmp')]

    def act(self, root):
        self._write(root, self._rows(2))


class _FakeCluster:
    """What ``multihost.network.measure`` asks of a cluster: hosts, links, no processes left."""

    def __init__(self, root):
        self.hosts, self.namespaces = ['h0', 'h1', 'h2', 'h3'], []
        self.hostfile = os.path.join(root, 'hostfile')

    def env(self):
        return dict(os.environ)

    def shape(self, i, rate):
        pass

    unshape = shape

    def job_pids(self):
        return {}


class _FakeLauncher:
    returncode, pid = 0, 0

    def __init__(self, *args, **kwargs):
        pass

    def communicate(self, timeout=None):  # pylint: disable=unused-argument
        return b'epoch 1: 0.1 s\n', None


class NetworkLog(Entry):
    name, what = 'network_log', 'the network study\'s run log (`lab/studies/network_study.measure`)'

    def _measure(self, root, steps):
        study = network_study
        config = study.Config('simple-cnn', 2, '1gbit', 32, steps)
        os.makedirs(os.path.join(root, 'work'), exist_ok=True)
        with patched(subprocess, 'Popen', _FakeLauncher):
            study.measure(_FakeCluster(root), config, os.path.join(root, 'work'),
                          log=os.path.join(root, 'run.log'))

    def previous(self, root):
        self._measure(root, 3)

    def act(self, root):
        self._measure(root, 4)


# -- the cluster's host file and the data ------------------------------------------------------

def _fake_keygen(argv, **kwargs):  # pylint: disable=unused-argument
    """``ssh-keygen -C COMMENT -f KEY``, made up: a key pair of fixed text with the comment, as
    ssh-keygen writes it (the cluster checks no key, and recognises its own by the comment)."""
    key, comment = argv[argv.index('-f') + 1], argv[argv.index('-C') + 1]
    write_bytes(key, 'PRIVATE KEY\n')
    write_bytes(key + '.pub', f'ssh-ed25519 AAAAharness {comment}\n')


class ClusterFiles(Entry):
    name, what = 'cluster_hostfile', 'a cluster\'s host file and ssh files (`lab/hosts/cluster`)'
    outputs = ('cluster', 'cluster/bin')  # both folders it writes files into

    def _write_files(self, root, hosts):
        cluster = __import__('lab.hosts.cluster', fromlist=['Cluster'])
        sshd = __import__('lab.hosts.sshd', fromlist=['check'])
        cl = cluster.Cluster.__new__(cluster.Cluster)
        cl.workdir, cl.name, cl.ssh_port = os.path.join(root, 'cluster'), 'gmharness', 22
        cl.host_cores = 1
        cl.hosts = [f'198.18.7.{i + 2}' for i in range(hosts)]
        os.makedirs(cl.workdir, exist_ok=True)
        with patched(sshd, 'check', _fake_keygen):
            cl._write_files()  # pylint: disable=protected-access

    def previous(self, root):
        self._write_files(root, 2)

    def decoys(self, root):
        return [user_file(root, 'cluster/notes.txt'),
                user_file(root, 'cluster/.hostfile.b1n2m3k4.tmp')]

    def act(self, root):
        self._write_files(root, 3)


def _idx_labels(count):
    """A gzipped IDX file of ``count`` labels (the bytes do not depend on the time)."""
    raw = struct.pack('>II', 0x00000801, count) + bytes(i % 10 for i in range(count))
    return gzip.compress(raw, mtime=0)


class DataDownload(Entry):
    name, what = 'data_download', 'the data download (`section/data.download_dataset`)'
    outputs = ('data',)
    missing = 't10k-labels-idx1-ubyte.gz'

    def previous(self, root):
        for name in gm.data.IDX_FILES.values():
            if name != self.missing:
                write_bytes(os.path.join(root, 'data', name), _idx_labels(3))
        write_bytes(os.path.join(root, 'mirror', 'fashion-mnist', self.missing), _idx_labels(5))

    def decoys(self, root):
        return [user_file(root, 'data/notes.txt'),
                user_file(root, f'data/.{self.missing}.c4v5b6n7.part')]

    def act(self, root):
        gm.data.download_dataset('fashion-mnist', os.path.join(root, 'data'),
                                 base_url='file://' + os.path.join(root, 'mirror'))


#: The entry points of the studies, the cluster and the data, in the order of the table.
ENTRIES = [cls() for cls in (FailoverResults, NetworkResults, NetworkLog, ClusterFiles,
                             DataDownload)]

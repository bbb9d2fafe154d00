"""The entry points through which the package writes files, for the fault-injection harness.

Each entry point (``Entry``) can put a PREVIOUS state in a folder (``previous``: the package's
own output of an earlier call, with other figures, so that it is recognised as the package's),
then call the writer (``act``) with small synthetic inputs: no training, no cluster, no network.
``decoys`` puts files of the user's beside the outputs, named like the package's temporary and
staging files, or hard-linked at a lock's name: none of them may change. ``fault_harness``
drives them. ``ENTRIES`` here are the package's own writers (files, charts, reports, results
files, checkpoints, locks, and what MXNet's profiler delivers); ``fault_studies.ENTRIES`` the
studies', the cluster's and the data's.
"""
import contextlib
import functools
import io
import json
import os
import types
import warnings

import gluon_multigpu as gm
from lab.studies import csvfiles
from lab.studies import scaling_model as lab_scaling
from lab.studies import scaling_report as lab_scaling_report
from lab.studies import sweep as lab_sweep

__all__ = ['Entry', 'ENTRIES', 'lock_name', 'user_file', 'user_folder', 'user_hardlink',
           'patched', 'write_bytes']


def lock_name(target):
    """The name of the lock beside ``target`` (the output layer's, where it says one)."""
    try:
        from gluon_multigpu.filesafety import lockfile as locks
    except ImportError:
        locks = None
    for attribute in ('lock_path', 'lock_name', 'path_of'):
        name = getattr(locks, attribute, None)
        if callable(name):
            return name(target)
    folder, base = os.path.split(target)
    return os.path.join(folder, f'.{base}.lock')


def write_bytes(path, data):
    """Write ``data`` (bytes or text) to ``path``, its folder made if missing (no ``fs``: setup)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data.encode() if isinstance(data, str) else data)


def user_file(root, rel, text='a file of the user\'s\n'):
    """A decoy: a file of the user's at ``rel``."""
    write_bytes(os.path.join(root, rel), text)
    return rel


def user_folder(root, rel):
    """A decoy: a folder of the user's at ``rel`` (named like a staging folder), a file inside."""
    write_bytes(os.path.join(root, rel, 'kept.txt'), 'the user keeps this here\n')
    return rel


def user_hardlink(root, rel, target_rel):
    """A decoy: a file of the user's at ``target_rel``, hard-linked at ``rel`` (a lock's name)."""
    user_file(root, target_rel, 'the user\'s file, also linked at a lock\'s name\n')
    os.link(os.path.join(root, target_rel), os.path.join(root, rel))
    return rel


class Entry:
    """One public way the package writes; subclasses set ``name`` and ``what``.

    ``previous(root)`` writes the previous state (by the package itself, as an earlier call
    would), ``decoys(root)`` the user's files and returns their relative paths, ``act(root)``
    writes the new state. ``outputs`` are the folders (relative) that ``output.recover`` is run
    on after a kill. ``normalize(rel, data)`` takes out what differs between two equal calls
    (a time of day).
    """
    name = what = ''
    outputs = ('.',)

    def previous(self, root):
        pass

    def decoys(self, root):
        return [user_file(root, 'notes.txt')]

    def act(self, root):
        raise NotImplementedError

    def normalize(self, rel, data):  # pylint: disable=unused-argument
        return data

    def partial_runs(self):
        """Shorter runs (callables of ``root``) whose end states are complete states too: a
        writer that keeps its results as it goes (a study's rows) may be stopped after any."""
        return []

    def recover(self, root):
        """After a kill: ``output.recover`` on each of ``outputs`` (nothing without the layer)."""
        try:
            from gluon_multigpu.filesafety import output
        except ImportError:
            return
        for rel in self.outputs if hasattr(output, 'recover') else ():
            folder = os.path.normpath(os.path.join(root, rel))
            if os.path.isdir(folder):
                output.recover(folder)


# -- single files -------------------------------------------------------------------------------

class OpCache(Entry):
    name, what = 'op_cache', "MXNet's operator functions' cache file (`base/opcache.write_table`)"
    outputs = ('gluon-multigpu',)

    @staticmethod
    def _write(root, value):
        from gluon_multigpu.base import opcache
        table = {('mxnet.ndarray.register', 'relu', 'relu'):
                 (compile(f'x = {value}', '<string>', 'exec'), f'version {value}', 1)}
        # best effort (a cache): False where it could not write, which surfaces here as the
        # failure the harness asks every entry point to report
        if not opcache.write_table(os.path.join(root, 'gluon-multigpu', 'mxnet-ops-k.marshal'),
                                   table):
            raise OSError('the cache file was not written')

    def previous(self, root):
        self._write(root, 1)

    def act(self, root):
        self._write(root, 2)



class WriteJson(Entry):
    name, what = 'write_json', '`--json` outputs (`files.write_json`)'

    def previous(self, root):
        gm.write_json(os.path.join(root, 'out.json'), {'runs': [1, 2], 'previous': True})

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.out.json.k3j9x2ab.tmp'),
                user_folder(root, '.report-abc.tmp')]

    def act(self, root):
        gm.write_json(os.path.join(root, 'out.json'), {'runs': [3, 4, 5], 'previous': False})


class WriteCsv(Entry):
    name, what = 'write_csv', '`--csv` outputs (`lab/studies/csvfiles.write_csv`)'
    columns = ['epoch', 'loss', 'acc']

    def previous(self, root):
        csvfiles.write_csv(os.path.join(root, 'out.csv'), [{'epoch': 1, 'loss': 0.5}], self.columns)

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.out.csv.a1b2c3d4.tmp')]

    def act(self, root):
        rows = [{'epoch': e, 'loss': 1.0 / e, 'acc': 0.5 + e / 10} for e in (1, 2, 3)]
        csvfiles.write_csv(os.path.join(root, 'out.csv'), rows, self.columns)


class Chart(Entry):
    name, what = 'chart', "the reports' bar charts (`study/charts.bar_chart`, matplotlib's)"

    def previous(self, root):
        gm.charts.bar_chart(os.path.join(root, 'chart.png'), ['a'], [1.0], 'old')

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.chart.png.zz99yy88.tmp')]

    def act(self, root):
        gm.charts.bar_chart(os.path.join(root, 'chart.png'), ['a', 'b'], [1.0, 2.0], 'new')


class ProfileTrace(Entry):
    """A profile's trace: MXNet's dump, read through a pipe (``filesafety/foreign``: its write is
    announced to ``fs``, where it can fail), then the trace written whole."""
    name = 'profile_trace'
    what = "`--profile` traces (`observe/profile.Profile`: MXNet's dump through `filesafety/foreign`)"

    @staticmethod
    def _profile(root, steps):
        import mxnet as mx  # pylint: disable=import-outside-toplevel
        from gluon_multigpu.observe.profile import Profile  # pylint: disable=import-outside-toplevel
        run = types.SimpleNamespace(devices=[mx.cpu(0)], train_iter=[None] * steps, epoch=1,
                                    num_epochs=1, error=None, steps=None)
        hook = Profile(f'1:{steps}', os.path.join(root, 'profile.json'), out=io.StringIO())
        hook.setup(run)
        hook.enter(run)
        hook.begin(run)
        try:
            for step in range(1, steps + 1):  # a step: an operator on the device
                (mx.np.ones((2, 2), ctx=mx.cpu(0)) * step).wait_to_read()
                hook.step_end(run, step, step, None)
        finally:
            hook.leave(run)

    def previous(self, root):
        self._profile(root, 1)

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.profile.json.k3j9x2ab.tmp'),
                user_file(root, '.profile.json.0a1b2c3d.mxnet.tmp')]  # MXNet's file's old name

    def act(self, root):
        self._profile(root, 2)

    def normalize(self, rel, data):
        """A trace as the steps it holds (two profiles of the same steps differ in times)."""
        if rel != 'profile.json':
            return data
        try:
            trace = json.loads(data)
        except ValueError:  # half written: compared as it is
            return data
        return json.dumps({'otherData': trace.get('otherData'),
                           'events': bool(trace.get('traceEvents'))}, sort_keys=True).encode()


class Plot(Entry):
    name, what = 'plot', "`--plot` charts of a run (`study/charts.accuracy_chart`, matplotlib's)"

    def previous(self, root):
        gm.charts.accuracy_chart(os.path.join(root, 'acc.png'), [_train_result('device', [1.0])])

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.acc.png.zz99yy88.tmp')]

    def act(self, root):
        gm.charts.accuracy_chart(os.path.join(root, 'acc.png'),
                                 [_train_result('device', [1.0, 0.9]),
                                  _train_result('local', [1.0, 1.1])], title='new')


class _Clock:
    """The clock ``observe/metrics`` reads, stopped at ``seconds``: two runs write equal files."""

    def __init__(self, seconds):
        self.seconds = seconds

    def time(self):
        return float(self.seconds)

    def time_ns(self):
        return self.seconds * 10**9

    def perf_counter(self):
        return float(self.seconds)


class MetricsLines(Entry):
    """A resumed run's figures: epoch 2 again over a file that holds epoch 1 and a step of epoch
    2 (the run stopped there), so the file is rewritten without that step, then appended to."""
    name = 'metrics_lines'
    what = '`--metrics` JSON lines (`observe/metrics.Metrics`: rewritten on resume, then appended)'
    #: Global steps between two step records: the first step of a fit opens the files only.
    every = 2

    def options(self, root):
        return {'path': os.path.join(root, 'm.jsonl')}

    def fit(self, root, epoch, steps, end=True, at=3):
        """Epoch ``epoch`` of a run of 2 steps an epoch, stopped after ``steps`` (and the
        epoch's record, with ``end``), the clock stopped at ``at`` (a new event file's name)."""
        from gluon_multigpu.observe import metrics  # pylint: disable=import-outside-toplevel
        hook = metrics.Metrics(every=self.every, **self.options(root))
        run = types.SimpleNamespace(epoch=epoch, train_iter=[None, None], scaler=None,
                                    steps=None, trainer=types.SimpleNamespace(learning_rate=0.1))
        record = types.SimpleNamespace(epoch=epoch, train_loss=1.0 / epoch, train_acc=0.5,
                                       test_acc=0.4 + epoch / 10, seconds=1.0,
                                       samples_per_sec=100.0)
        with patched(metrics, 'time', _Clock(1000 + at)):
            hook.enter(run)
            try:
                for step in range(1, steps + 1):
                    hook.step_end(run, step, 8 * step, None)
                if end:
                    hook.epoch_end(run, record)
            finally:
                hook.leave(run)

    def previous(self, root):
        self.fit(root, 1, 2, at=1)
        self.fit(root, 2, 2, end=False, at=2)  # global step 4's record: dropped on resume

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.m.jsonl.k3j9x2ab.tmp')]

    def act(self, root):
        self.fit(root, 2, 2)

    def partial_runs(self):
        """Stopped after its first step (the files opened) or its second (its record)."""
        return [lambda root: self.fit(root, 2, 1, end=False),
                lambda root: self.fit(root, 2, 2, end=False)]


class EventFiles(MetricsLines):
    name = 'tensorboard_events'
    what = ("`--tensorboard` event files (`observe/metrics.Metrics`: tensorboardX's records, "
            'a new file each fit)')

    def options(self, root):
        return {'tensorboard': os.path.join(root, 'tb')}

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, 'tb/notes.txt')]


# -- report folders -----------------------------------------------------------------------------

def _train_result(kvstore, seconds):
    result = gm.TrainResult(devices=['cpu(0)', 'cpu(1)'], kvstore=kvstore, lr=0.2)
    for i, s in enumerate(seconds, start=1):
        result.epochs.append(gm.EpochRecord(i, 0.5, 0.8, 0.8 + i / 100, s, 1.0, 600))
    return result


class ReportEntry(Entry):
    """A report folder ``report`` written all or nothing, beside a user's files in it."""
    outputs = ('report',)

    def decoys(self, root):
        return [user_file(root, 'report/notes.txt'), user_folder(root, 'report/.report-abc.tmp'),
                user_file(root, 'report/.report.md.q1w2e3r4.tmp')]

    def write(self, directory, new):
        raise NotImplementedError

    def previous(self, root):
        self.write(os.path.join(root, 'report'), new=False)

    def act(self, root):
        self.write(os.path.join(root, 'report'), new=True)


class KvstoreReport(ReportEntry):
    name, what = 'kvstore_report', 'kvstore comparison report (`study/kvstore_report.py`)'

    def write(self, directory, new):
        scale = 0.8 if new else 1.0
        results = [_train_result('local', [10.0 * scale]), _train_result('device', [8.0 * scale])]
        tracker = gm.ParamTracker()
        tracker.reference = 'local'
        config = {'model': 'simple-cnn', 'dataset': 'fashion-mnist', 'num_train': 600,
                  'num_test': 100, 'batch_size': 64, 'lr': 0.2, 'seed': 0}
        gm.write_kvstore_report(directory, results, tracker, config,
                                'device is fastest.' if new else 'local is fastest.')


class ScalingReport(ReportEntry):
    name, what = 'scaling_report', 'scaling report (`lab/studies/scaling_report.py`)'

    def write(self, directory, new):
        rows = [dict(dict.fromkeys(lab_scaling.MEASURED_COLUMNS), kind='measured',
                     devices=d, kvstore='device', batch_mode='per-device', batch_size=32 * d,
                     per_device_batch=32, lr_rule='linear', lr=0.1 * d, status='ok', epochs=1,
                     samples_per_sec=(100.0 if new else 90.0) * d ** 0.9, test_acc=0.5,
                     speedup=d ** 0.9, efficiency=d ** -0.1) for d in (1, 2)]
        config = {'model': 'simple-cnn', 'device_type': 'cpu', 'dataset': 'fashion-mnist',
                  'num_train': 64, 'num_test': 32, 'epochs': 1, 'seed': 0, 'counts': [1, 2],
                  'base_lr': 0.1, 'engine': 'harness', 'project_to': 2, 'compute_repeats': 1,
                  'sync_repeats': 1}
        lab_scaling_report.write_scaling_outputs(directory, config, rows, [], [])


class BalanceReport(ReportEntry):
    name, what = 'balance_report', 'balance report (`lab/commands/balance_study.py` `write_outputs`)'

    def write(self, directory, new):
        balance = __import__('lab.commands.balance_study', fromlist=['write_outputs'])
        rows = [{'scenario': 'equal', 'split': s, 'images_per_sec': 100.0 + new * i,
                 'vs_even': 1.0, 'idle': [0.1, 0.2], 'shares': [16, 16], 'changes': 0,
                 'undone': 0, 'rounds': [100.0]} for i, s in enumerate(balance.SPLITS)]
        balance.write_outputs(directory, rows, ['cpu(0)', 'cpu(1)'],
                              {'model': 'simple-cnn', 'batch': 32, 'command': 'balance.py'})


# -- results files and their locks --------------------------------------------------------------

def _units():
    return [lab_sweep.Unit('u1', 'the first'), lab_sweep.Unit('u2', 'the second')]


def _sweep(root, resume=True):
    return lab_sweep.Sweep(os.path.join(root, 'results.json'), 'fault-harness', {'k': 1},
                          _units(), say=lambda line: None, resume=resume, interval=0)


class SweepResults(Entry):
    name, what = 'sweep_results', 'a sweep\'s results file (`lab/studies/sweep.Sweep`: open, keep, close)'

    def previous(self, root):
        with _sweep(root, resume=False) as sweep:
            sweep.keep(_units()[0], {'value': 1})  # a partial run: 1 of 2

    def decoys(self, root):
        return [user_file(root, 'notes.txt'), user_file(root, '.results.json.m4n5b6v7.tmp'),
                user_folder(root, '.report-abc.tmp')]

    def act(self, root):
        with _sweep(root) as sweep:
            sweep.keep(_units()[1], {'value': 2})


class SweepLock(SweepResults):
    name, what = 'sweep_lock', 'the results file\'s lock (a user\'s file hard-linked at its name)'

    def decoys(self, root):
        lock = os.path.relpath(lock_name(os.path.join(root, 'results.json')), root)
        return [user_hardlink(root, lock, 'mine.txt'), 'mine.txt']

    def act(self, root):
        with _sweep(root):
            pass


# -- checkpoints --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _network():
    """A tiny Gluon net and its Trainer on one CPU context, one step taken (state to save)."""
    import mxnet as mx  # pylint: disable=import-outside-toplevel
    from mxnet import np  # pylint: disable=import-outside-toplevel
    with warnings.catch_warnings():  # the engine's settings for one context: not needed here
        warnings.simplefilter('ignore')
        devices = gm.cpu_devices(1)
    net = mx.gluon.nn.Dense(3)
    net.initialize(mx.init.Xavier(), ctx=devices)
    trainer = gm.training.make_trainer(net, 0.1, 'device')
    gm.train_batch(net, np.ones((4, 5)), np.zeros(4, dtype='int32'),
                   mx.gluon.loss.SoftmaxCrossEntropyLoss(), trainer, devices)
    return net, trainer


def _history(epochs):
    return [gm.EpochRecord(e, 1.0, 0.5, 0.5, 1.0, 0.1, 8) for e in range(1, epochs + 1)]


class CheckpointSave(Entry):
    name, what = 'checkpoint_save', 'a checkpoint save over the last one (`checkpoints/checkpoint`)'
    outputs = ('ckpt',)
    config = {'model': 'dense', 'seed': 0}

    def previous(self, root):
        net, trainer = _network()
        with gm.Checkpointer(os.path.join(root, 'ckpt'), self.config) as ckpt:
            ckpt.check_directory()
            ckpt.save(net, trainer, _history(1), 1)

    def decoys(self, root):
        return [user_file(root, 'ckpt/notes.txt'), user_folder(root, 'ckpt/.ckpt-save.abc123'),
                user_file(root, 'ckpt/.manifest.json.p0o9i8u7.tmp')]

    def act(self, root):
        net, trainer = _network()
        with gm.Checkpointer(os.path.join(root, 'ckpt'), self.config, resume=True) as ckpt:
            ckpt.check_directory()
            ckpt.save(net, trainer, _history(2), 2)

    def normalize(self, rel, data):
        if os.path.basename(rel) != 'manifest.json':
            return data
        try:
            text = json.loads(data)
        except ValueError:  # half written: compared as it is
            return data
        if isinstance(text, dict) and 'written' in text:
            text['written'] = '<time>'  # the time of the save
        return json.dumps(text, sort_keys=True).encode()

    def recover(self, root):
        """``output.recover``, then the checkpoint's own recovery where it has one."""
        super().recover(root)
        recover = getattr(gm.checkpoint, 'recover', None)
        if callable(recover) and os.path.isdir(os.path.join(root, 'ckpt')):
            recover(os.path.join(root, 'ckpt'))


class CheckpointLock(CheckpointSave):
    name = 'checkpoint_lock'
    what = 'the checkpoint folder\'s lock (a user\'s file hard-linked at its name)'

    def decoys(self, root):
        return [user_hardlink(root, 'ckpt/.lock', 'mine.txt'), 'mine.txt']

    def act(self, root):
        with gm.Checkpointer(os.path.join(root, 'ckpt'), self.config, resume=True) as ckpt:
            ckpt.check_directory()


@contextlib.contextmanager
def patched(owner, attribute, value):
    old = getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield
    finally:
        setattr(owner, attribute, old)


#: Every entry point, in the order of the table.


#: The entry points of the package's own writers, in the order of the table.
ENTRIES = [cls() for cls in (WriteJson, WriteCsv, OpCache, Chart, Plot, ProfileTrace,
                             MetricsLines, EventFiles, KvstoreReport, ScalingReport, BalanceReport,
                             SweepResults, SweepLock, CheckpointSave, CheckpointLock)]

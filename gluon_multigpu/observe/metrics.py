"""Figures a dashboard reads: ``Metrics``, a hook of ``train`` that writes TensorBoard event files
(tensorboardX's records) and JSON lines.

Every ``every`` global steps it reads back the training loss and accuracy of the steps since its
last figures, the learning rate, images/s and the gradient norm (one sync point for all); after
each epoch, the epoch's figures. The global step of step ``s`` of epoch ``e`` is
``(e - 1) * steps per epoch + s``. A run resumed from a checkpoint continues the same curves:
the first step it runs is the purge step, at or after which what the earlier run wrote is
dropped (TensorBoard's reader does it for an event file with a purge step; the JSON lines are
rewritten whole without those lines, then appended to; a file holding other lines is refused).
Only ``rank`` 0 writes (the first worker of a parameter server). Both files are written through
``filesafety/fs`` (a failure is an ``OSError`` naming the file), the JSON file under its lock; the
event records are tensorboardX's, loaded only when ``tensorboard`` is given, its writer (a
thread, an atexit handler) never started.
"""
import json
import math
import os
import socket
import struct
import time

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import np

from ..filesafety import atomic, fs, lockfile, reading
from ..filesafety.paths import check_argument, resolve_output
from ..errors import GluonMultiGPUError
from .hooks import Hook
from ..base.values import tensorboardx_missing, whole

__all__ = ['Metrics', 'STEP_FIGURES', 'EPOCH_FIGURES']

#: The figures of a ``step`` record (the steps since the last one) and of an ``epoch`` record.
STEP_FIGURES = ('loss', 'accuracy', 'learning_rate', 'images_per_sec', 'grad_norm')
EPOCH_FIGURES = ('train_loss', 'train_accuracy', 'test_accuracy', 'seconds', 'images_per_sec')
#: The largest metrics file read back when a run resumes (a line is some 200 bytes).
MAX_LINES_FILE = 1 << 30
#: The most steps between two figures.
MAX_EVERY = 10**6


def _record(line):
    """The record of the package's that ``line`` is (a dict), or None."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get('step') if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) and record.get(
        'kind') in ('step', 'epoch') and isinstance(record.get('values'), dict) else None


class _Records:
    """A file of records, each written (``fs.write``) as it comes, fsynced by ``sync``; a
    failure names ``path``, and the file written is ``_target``."""

    path = _target = _fd = None

    def _put(self, data):
        with atomic.naming(self.path):
            fs.write(self._fd, data, self._target)

    def sync(self):
        with atomic.naming(self.path):
            fs.fsync(self._fd, self._target)

    def close(self):
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class JsonLines(_Records):
    """The JSON-lines file: one object per line, each line written (unbuffered) as it comes.

    ``check`` refuses a file holding a line that is no record of the package's (the last one
    excepted if a kill cut it short: no line end); ``open(purge)`` drops the lines at or after
    global step ``purge`` (and a line cut short), replacing the file whole, then appends;
    ``sync`` fsyncs (after each epoch).
    """

    def __init__(self, path):
        self.path = path

    def _read(self):
        """``[(line, record)]`` of the file and its first other line (``(number, line)``, or
        None); a last line without its end (cut short by a kill) is neither."""
        try:
            text = reading.read_bytes(resolve_output(self.path, '`metrics`'), MAX_LINES_FILE,
                                      '`metrics`').decode('utf-8', 'replace')
        except FileNotFoundError:
            text = ''
        records, other = [], None
        for number, line in enumerate(text.split('\n')[:-1], start=1):
            record = _record(line)
            if record is not None:
                records.append((line, record))
            elif other is None:
                other = (number, line)
        return records, other

    def check(self):
        """Raise ``GluonMultiGPUError`` if the file holds a line the package did not write."""
        _, other = self._read()
        if other is not None:
            raise GluonMultiGPUError(
                f'the metrics file {self.path} holds lines that gluon-multigpu did not write '
                f'(line {other[0]}: {other[1].strip()[:60]!r}); it is left as it is: move it '
                'away, or give `metrics` another path')

    def open(self, purge):
        self._target = target = resolve_output(self.path, '`metrics`')
        kept = [line + '\n' for line, record in self._read()[0] if record['step'] < purge]
        with atomic.naming(self.path):
            atomic.write_file(target, ''.join(kept).encode('utf-8'))
            self._fd = fs.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def write(self, kind, step, epoch, values):
        record = {'kind': kind, 'step': step, 'epoch': epoch, 'time': round(time.time(), 3),
                  'values': {k: v if v is None or math.isfinite(v) else None  # JSON: null
                             for k, v in values.items()}}
        self._put((json.dumps(record, allow_nan=False) + '\n').encode('utf-8'))


class EventFiles(_Records):
    """A TensorBoard event file, a new one each ``open``, written as JsonLines is: each record
    as it comes (``fs.write``), fsynced by ``sync``.

    Tags are ``step/<figure>`` and ``epoch/<figure>``. The file's purge step makes TensorBoard's
    reader drop the events at or after it that earlier files hold. The records are those
    tensorboardX's ``SummaryWriter`` writes (TFRecord frames of ``Event``), written here: its
    ``(Event, SessionLog, Summary, masked_crc32c)`` are loaded when this is made (a missing
    tensorboardX is one line saying how to install it).
    """

    def __init__(self, folder):
        # pylint: disable=import-outside-toplevel
        try:
            import tensorboardX  # noqa: F401  (the package itself: a missing one is missing)
            from tensorboardX.proto.event_pb2 import Event, SessionLog
            from tensorboardX.proto.summary_pb2 import Summary
            from tensorboardX.record_writer import masked_crc32c
        except ImportError:
            raise GluonMultiGPUError(tensorboardx_missing()) from None
        self.folder, self._records = folder, (Event, SessionLog, Summary, masked_crc32c)

    def open(self, purge):
        atomic.makedirs(self.folder)
        # The name sorts by time to the nanosecond: a resumed run's file comes after the
        # stopped one's, in the order TensorBoard's reader goes through them.
        now = time.time_ns()
        self.path = self._target = os.path.join(
            self.folder, f'events.out.tfevents.{now // 10**9}.{socket.gethostname()}.{now:020d}')
        event, session = self._records[:2]
        opening = self._frames([
            event(wall_time=time.time(), file_version='brain.Event:2'),
            event(wall_time=time.time(), step=purge, file_version='brain.Event:2'),
            event(wall_time=time.time(), step=purge, session_log=session(status=session.START))])
        with atomic.naming(self.path):
            # made whole and named durably, or not at all: a failure, a kill or a power cut
            # leaves no empty event file (nor takes a name another file has)
            atomic.create_whole(self.path, opening)
            atomic.fsync_directory(self.folder)
            self._fd = fs.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)

    def write(self, kind, step, epoch, values):  # pylint: disable=unused-argument
        event, _, summary, _ = self._records
        self._put(self._frames([event(wall_time=time.time(), step=step, summary=summary(value=[
            summary.Value(tag=f'{kind}/{name}', simple_value=value)]))
            for name, value in values.items()]))

    def _frames(self, events):
        """``events`` as TFRecord frames (length, its checksum, the record, its checksum)."""
        crc, frames = self._records[3], []
        for record in events:
            data = record.SerializeToString()
            header = struct.pack('<Q', len(data))
            frames += [header, struct.pack('<I', crc(header)), data, struct.pack('<I', crc(data))]
        return b''.join(frames)


class Metrics(Hook):
    """Write a run's figures for a dashboard: TensorBoard event files in the folder
    ``tensorboard`` (made if missing) and/or JSON lines in the file ``path``.

    A step record every ``every`` global steps (``STEP_FIGURES``: loss and accuracy of the
    steps since the last record, learning rate, images/s, gradient norm before clipping); an
    epoch record after each epoch (``EPOCH_FIGURES``: train loss and accuracy, test accuracy,
    seconds, images/s). A JSON line is ``{"kind": "step"|"epoch", "step": global step,
    "epoch": E, "time": unix seconds, "values": {...}}``.

    Parameters
    ----------
    tensorboard : str or os.PathLike, optional
        Folder of the event files (made if missing; its parent must exist). None: no event
        files (tensorboardX is then not needed).
    path : str or os.PathLike, optional
        The JSON-lines file (its folder must exist). None: no JSON lines.
    every : int
        Global steps between two step records, 1 to ``MAX_EVERY``.
    rank : int
        This worker's rank on a parameter server (0 for a single process); only rank 0 writes.
    """

    def __init__(self, tensorboard=None, path=None, every=50, *, rank=0):
        self.every = whole(1, MAX_EVERY, '`log_every` is {value!r}: give the steps between two '
                           'logged figures, a whole number from 1 to {high}', optional=False)(every)
        self.tensorboard = None if tensorboard is None else check_argument(tensorboard,
                                                                           'tensorboard', True)
        self.path = None if path is None else check_argument(path, 'metrics', False)
        self.rank = whole(0, math.inf, 'the rank is {value!r}: give a whole number of 0 or more',
                          optional=False)(rank)
        self._files = ([] if path is None else [JsonLines(self.path)]) + (
            [] if tensorboard is None else [EventFiles(self.tensorboard)])  # (opened by a fit)
        self._sinks = []  # the open files (one fit's)
        self._lock = None  # the metrics file's lock, held through a fit
        self._epoch = None  # the epoch whose steps are being counted (None: none yet this fit)
        self._per_epoch = None  # steps per epoch (None: the data has no length)
        self._offset = self._last = 0  # global steps before this epoch (no length), last seen
        self._window = None  # (first step, samples before it, time it began) of the next record

    @property
    def writes(self):
        """Whether this hook writes anything (an output given, rank 0)."""
        return self.rank == 0 and (self.tensorboard is not None or self.path is not None)

    def setup(self, run):
        """Ask the step for the gradient norm of every update (``run.want_grad_norm``); not
        with loss scaling (float16), whose step keeps its own update."""
        if self.writes and run.scaler is None:
            run.want_grad_norm = True

    def enter(self, run):
        """A fit begins: the metrics file is locked against another run (``lockfile``), and its
        first step starts the count again (nothing is opened yet)."""
        self._epoch = None
        if self.writes and self.path is not None and self._lock is None:
            folder, name = os.path.split(resolve_output(self.path, '`metrics`'))
            self._lock = lockfile.Lock(os.path.join(folder, f'.{name}.lock'), held=lambda who: (
                f'another run{who} is writing the metrics file {self.path}; wait until it ends, '
                'or give `metrics` another path'), fix='give `metrics` another path').acquire()
            try:
                JsonLines(self.path).check()  # before any step: nothing written yet
            except BaseException:
                self.leave(run)  # the lock goes (no file is open yet)
                raise

    def step_end(self, run, step, samples, timer):
        """Count step ``step``; at every ``every``-th global step, write a step record."""
        if not self.writes:
            return
        if run.epoch != self._epoch:  # the first step of an epoch, or of this fit
            self._epoch = run.epoch
            self._per_epoch = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
            elapsed = timer.elapsed() if timer is not None else 0.0
            self._window = (step, 0, time.perf_counter() - elapsed)
        # the global step: counted by epoch where the data has a length, else from the last epoch's
        self._last = ((run.epoch - 1) * self._per_epoch if self._per_epoch else self._offset) + step
        if not self._sinks:  # the first step of this fit: the earlier curves end before it
            self._open(self._last)
        if self._last % self.every == 0:
            self._write('step', self._last, run.epoch, self._step_values(run, step, samples))

    def epoch_end(self, run, record):
        """Write the epoch record at the epoch's last global step, and make the files durable."""
        if not self.writes:
            return
        step = run.epoch * self._per_epoch if self._per_epoch else self._last
        if not self._sinks:
            self._open(step)
        values = dict(zip(EPOCH_FIGURES, (record.train_loss, record.train_acc, record.test_acc,
                                          record.seconds, record.samples_per_sec)))
        self._write('epoch', step, record.epoch, values)
        for sink in self._sinks:
            sink.sync()
        if not self._per_epoch:
            self._offset = step
        self._epoch = None  # the next epoch starts its own count

    def leave(self, run):
        """Close the files and let the lock go (every fit ends so, also on a stop or an error)."""
        sinks, self._sinks = self._sinks, []
        try:
            for sink in sinks:
                sink.close()
        finally:
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()

    # -- the counting ---------------------------------------------------------------------

    def _open(self, purge):
        self._sinks = self._files  # (before opening them: ``leave`` closes what was opened)
        for sink in self._sinks:
            sink.open(purge)

    def _write(self, kind, step, epoch, values):
        values = {k: v for k, v in values.items() if v is not None}  # a figure not known here
        for sink in self._sinks:
            sink.write(kind, step, epoch, values)

    def _step_values(self, run, step, samples):
        """The step record of the steps since the last one, up to ``step`` (one sync point)."""
        first, before, began = self._window
        steps = getattr(run, 'steps', None)
        values = dict.fromkeys(STEP_FIGURES)
        if steps is not None:
            a, b = first - steps.first_step, step - steps.first_step + 1
            norms = getattr(steps, 'norms', None) or []
            loss, correct, norm = _read([[l[a:b] for l in steps.losses],
                                         [c[a:b] for c in steps.correct], [norms[-1:]]])
            count = samples - before
            values.update(loss=loss / count, accuracy=correct / count,
                          grad_norm=norm if norms else None)
        rates = getattr(steps, 'rates', None) or [getattr(run.trainer, 'learning_rate', None)]
        values['learning_rate'] = rates[-1]
        now = time.perf_counter()
        values['images_per_sec'] = (samples - before) / max(now - began, 1e-9)
        self._window = (step + 1, samples, now)
        return {k: (None if v is None else float(v)) for k, v in values.items()}


def _read(groups):
    """The sum of each group (lists of lists of 0-d arrays, on any devices), read back at once."""
    owned = [(g, np.stack([a.astype('float32') for a in arrays]).sum().as_in_ctx(mx.cpu()))
             for g, group in enumerate(groups) for arrays in group if arrays]
    values = np.stack([s for _, s in owned]).asnumpy().astype('float64').tolist() if owned else []
    return [sum((v for (o, _), v in zip(owned, values) if o == g), 0.0) for g in range(len(groups))]

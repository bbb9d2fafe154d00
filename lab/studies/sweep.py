"""A long measuring run (a sweep): a results file kept after each measurement, an estimate, resume.

``scripts/bandwidth.py``, ``scaling.py``, ``balance.py`` and ``bfloat16.py``
each take many measurements, minutes to hours in all. A ``Sweep`` is such a
run cut into units (one configuration each) that it measures in turn:

In lab/NOTES.md, under this module's name.
"""
import json
import os
import signal
import threading
import time

from gluon_multigpu.errors import GluonMultiGPUError, Interrupted
from gluon_multigpu.filesafety import fs, reading
from gluon_multigpu.filesafety import targets
from gluon_multigpu.filesafety.files import write_json
from gluon_multigpu.filesafety.lockfile import Lock
from lab.studies.budget import check_memory, duration, fit_to_memory, size  # noqa: F401 (kept importable from here)

__all__ = ['Unit', 'Sweep', 'SweepError', 'check_memory', 'fit_to_memory', 'size', 'duration',
           'FORMAT', 'rows_ok', 'numbers_ok', 'RESULTS_LIMIT', 'check_stop']

#: The most a results file may hold (a sweep's is a few kB to a few MB).
RESULTS_LIMIT = 64 << 20
#: The ``format`` field of a results file: what a resume accepts.
FORMAT = 'gluon-multigpu sweep results 1'


def check_stop(stop):
    """Raise ``Interrupted`` if ``stop`` (a ``StopRequest``, or None) has been asked to stop.

    What work that is not a training run asks between its steps (a measurement's repeats).
    """
    if stop is not None and stop():
        raise Interrupted.by_signal(stop.signum or signal.SIGINT)


class SweepError(GluonMultiGPUError):
    """A results file that cannot be continued or replaced: one line, status 2."""


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def rows_ok(rows, columns, text=('model', 'device_type', 'kvstore', 'kind', 'batch_mode',
                                 'lr_rule', 'status')):
    """Whether ``rows`` is a list of dicts holding every one of ``columns``: those in ``text``
    strings (or None), the others numbers (or None). A ``check`` for ``Sweep``."""
    return isinstance(rows, list) and all(
        isinstance(r, dict) and all(c in r and (r[c] is None or (
            isinstance(r[c], str) if c in text else _number(r[c]))) for c in columns)
        for r in rows)


def numbers_ok(values, length=None):
    """Whether ``values`` is a list of numbers (of ``length``, if given)."""
    return isinstance(values, list) and all(_number(v) for v in values) and \
        (length is None or len(values) == length)


class Unit:
    """One measurement of a study: ``key`` (unique, kept in the file), ``label``, ``work``."""

    def __init__(self, key, label, work=1.0):
        self.key, self.label, self.work = str(key), label, float(work)

    def __repr__(self):
        return f'Unit({self.key!r}, {self.label!r}, {self.work:g})'


class Sweep:
    """A measuring run cut into ``units``, kept in the results file ``path`` as it goes.

    Use as a context manager: while it is open, a thread says every
    ``interval`` seconds which unit is being measured. ``run`` measures the
    units not yet done, in order.

    (More: lab/NOTES.md.)
    """

    def __init__(self, path, program, config, units, say, resume=False, advice='',
                 interval=10.0, first_estimate=5.0, make_folder=False, overwrite=False,
                 check=None):
        self.path, self.program, self.config = path, program, json.loads(json.dumps(config))
        self.units, self.say, self.advice, self.check = list(units), say, advice, check
        self.interval, self.first_estimate = interval, first_estimate
        keys = [u.key for u in self.units]
        if len(set(keys)) != len(keys):
            raise ValueError('the keys of a study must differ')
        self.done = {}  # key -> {'result': ..., 'seconds': ...}
        self._order = []  # keys measured in this process, in the order they ended
        self.resumed = 0
        self._current = self._started = None
        self._current_work = 0.0
        self._estimated = False
        self._lock = threading.Lock()
        self._ticker = self._quit = None
        self._writing = threading.Lock()  # held while the file is replaced (``abandon``)
        self._lock_file, self._made = None, []
        self.target = self._check_path(make_folder)
        try:
            self._take_lock()
            self._load(resume, overwrite)
        except BaseException:
            self.close()
            raise

    # -- the lock --------------------------------------------------------------------------

    def _check_path(self, make_folder):
        """The file written (links followed), checked; its folder made if ``make_folder``."""
        target = targets.resolve_output(self.path, '`results`')
        folder = os.path.dirname(target)
        if make_folder and not os.path.lexists(folder):
            probe, missing = folder, []
            while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
                missing.append(probe)  # innermost first: the order to remove them in
                probe = os.path.dirname(probe)
            if os.path.isdir(probe):
                try:
                    for directory in reversed(missing):
                        fs.mkdir(directory)
                        self._made.insert(0, directory)
                except OSError:
                    pass  # said by the check below
        try:
            targets.check_output_path(self.path, '`results`')
        except BaseException:
            self._remove_made()
            raise
        return target

    def _take_lock(self):
        """Hold ``.NAME.lock`` beside the results file (``lockfile.Lock``), or raise ``SweepError``."""
        folder, name = os.path.split(self.target)
        self._lock_file = Lock(
            os.path.join(folder, f'.{name}.lock'),
            held=lambda who: f'another run{who} is writing {self.path}; wait until it ends, or '
                             'give the results another path',
            fix='give the results another path', error=SweepError, say=self.say).acquire()

    def close(self):
        """Let go of the results file: remove the lock file, and the folder made if still empty."""
        if self._lock_file is not None:
            self._lock_file.release()  # removed while still held: no one locks the old file after
            self._lock_file = None
        self._remove_made()

    def _remove_made(self):
        for directory in self._made:
            try:
                os.rmdir(directory)  # only while empty: a results file keeps it
            except OSError:
                break
        self._made = []

    def abandon(self, timeout=5.0):
        """Before the process ends at once (``os._exit``, from another thread): wait up to
        ``timeout`` seconds for a write of the results file in progress, then remove the lock
        file (and the folder made for it, if still empty). The main thread writes nothing more
        afterwards; returns whether the file was left whole (no write in progress)."""
        whole = self._writing.acquire(timeout=timeout)  # never released: no write after this
        if self._lock_file is not None:  # still ours (after ``close`` another run may hold it)
            self._lock_file.release()
            self._lock_file = None
            self._remove_made()
        return whole

    # -- the file --------------------------------------------------------------------------

    def _read(self):
        try:
            data = json.loads(reading.read_bytes(self.target, RESULTS_LIMIT, '`results`'))
        except FileNotFoundError:
            return None
        except GluonMultiGPUError as e:
            raise SweepError(str(e)) from None
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
            why = f'{type(e).__name__}: {e}' if isinstance(e, ValueError) else e
            raise SweepError(f'{self.path} is not a results file of {self.program} (it cannot be '
                             f'read as JSON: {why}); give the results another path, or remove '
                             'it') from None
        if not isinstance(data, dict) or data.get('format') != FORMAT or \
                data.get('program') != self.program or not isinstance(data.get('done'), list) \
                or not all(isinstance(d, dict) and isinstance(d.get('key'), str) and
                           'result' in d for d in data['done']):
            raise SweepError(f'{self.path} is not a results file of {self.program}; give the '
                             'results another path, or remove it')
        return data

    def _load(self, resume, overwrite):
        data = self._read()
        if data is None:
            return
        done = data['done']
        if not resume:
            if overwrite:
                return  # replaced by this run's first measurement, not before
            held = 'a partial' if data.get('status') == 'partial' else 'a complete'
            raise SweepError(f'{self.path} holds {held} run of {self.program} ({len(done)} of '
                             f'{data.get("total", "?")} measurements); continue it with '
                             '`resume=True` (the same settings), give the results another path '
                             '(`results`), or replace it with `overwrite=True`')
        if data.get('config') != self.config:
            changed = sorted(k for k in set(self.config) | set(data.get('config') or {})
                             if (data.get('config') or {}).get(k) != self.config.get(k))
            raise SweepError(f'{self.path} holds a run with other settings ({", ".join(changed)} '
                             'differ); resume with the settings it was started with, or give '
                             'the results another path')
        units = {u.key: u for u in self.units}
        self.done = {d['key']: d for d in done if d['key'] in units}
        for key, d in self.done.items():
            seconds = d.get('seconds')
            if not (seconds is None or _number(seconds)) or \
                    (self.check is not None and not self.check(units[key], d['result'])):
                raise SweepError(f'{self.path}: its measurement {key} is damaged (not what '
                                 f'{self.program} writes); give the results another path, or '
                                 'start again with `overwrite=True`')
        self.resumed = len(self.done)

    def _write(self, status):
        with self._writing:
            write_json(self.target, {
                'format': FORMAT, 'program': self.program, 'status': status,
                'total': len(self.units), 'config': self.config,
                'done': [dict(self.done[u.key], key=u.key, label=u.label)
                         for u in self.units if u.key in self.done]})
            self._made = []  # the folder holds the results now: it stays

    @property
    def complete(self):
        """Whether every unit has been measured."""
        return all(u.key in self.done for u in self.units)

    def results(self):
        """``(unit, result)`` of every unit measured so far, in the units' order."""
        return [(u, self.done[u.key]['result']) for u in self.units if u.key in self.done]

    def result(self, unit):
        """The result of ``unit``, or None if not measured yet."""
        d = self.done.get(unit.key)
        return None if d is None else d['result']

    # -- measuring -------------------------------------------------------------------------

    def pending(self):
        """The units still to measure, in order."""
        return [u for u in self.units if u.key not in self.done]

    def run(self, measure):
        """Measure every pending unit with ``measure(unit)`` (its result: JSON values); keep each.

        Returns the results of all units, in order (``results``).
        """
        for unit in self.pending():
            self.begin(unit)
            self.keep(unit, measure(unit))
        return self.results()

    def begin(self, unit):
        """Say that ``unit`` is being measured now."""
        with self._lock:
            self._current, self._started, self._current_work = unit, time.monotonic(), 0.0
        index = self.units.index(unit) + 1
        self.say(f'[{index}/{len(self.units)}] {unit.label}')

    def advance(self, work_done):
        """Within the current unit: ``work_done`` of its work is done (for an early estimate)."""
        with self._lock:
            if self._current is None:
                return
            self._current_work = min(work_done, self._current.work)
            seconds = time.monotonic() - self._started
        if not self._estimated and seconds >= self.first_estimate and work_done > 0:
            self._say_estimate()

    def keep(self, unit, result):
        """Record ``unit``'s ``result`` and write the results file (partial until the last)."""
        with self._lock:
            seconds = time.monotonic() - self._started if self._current is unit else None
            self._current = None
        self.done[unit.key] = {'result': result, 'seconds': seconds}
        if seconds is not None:
            self._order.append(unit.key)
        self._write('complete' if self.complete else 'partial')
        if not self.complete and not self._estimated:
            self._say_estimate()
        elif len(self._order) == 2 and len(self.pending()) > 1:  # worth saying again
            self._say_estimate(revised=True)

    def _rate(self):
        """Seconds per unit of work measured so far in this process, or None.

        Once a second unit is measured, the first one measured in this process
        no longer counts: it carried the start-up (graphs compiled, kernels
        made), which made a first estimate up to three times too long.
        """
        with self._lock:
            timed = [k for k in self._order if self.done[k].get('seconds') is not None]
            if len(timed) > 1:
                timed = timed[1:]
            works = {u.key: u.work for u in self.units}
            work = sum(works[k] for k in timed)
            seconds = sum(self.done[k]['seconds'] for k in timed)
            if self._current is not None and self._current_work > 0:
                work += self._current_work
                seconds += time.monotonic() - self._started
        return seconds / work if work > 0 and seconds > 0 else None

    def left(self):
        """Estimated seconds until the last unit is measured, or None (nothing measured yet)."""
        rate = self._rate()
        if rate is None:
            return None
        with self._lock:
            work = sum(u.work for u in self.units if u.key not in self.done)
            current, done, started = self._current, self._current_work, self._started
        if current is None:
            return rate * work
        if done > 0:
            return rate * max(work - done, 0.0)
        # No word from inside the unit: count its time so far, but never below the units after it.
        elapsed = time.monotonic() - started
        return max(rate * work - elapsed, rate * (work - current.work))

    def _say_estimate(self, revised=False):
        rate = self._rate()
        if rate is None:
            return
        self._estimated = True
        total = rate * sum(u.work for u in self.units)
        left = self.left()
        if revised:  # the second measurement: the rate without the first one's start-up
            self.say(f'estimate, from the measurements after the first: about {duration(left)} '
                     'left')
            return
        done = '' if not self.resumed else f', {self.resumed} kept from before'
        self.say(f'estimate: the whole run ({len(self.units)} measurements{done}) takes about '
                 f'{duration(total)}, about {duration(left)} left'
                 + (f'; faster: {self.advice}' if self.advice else ''))

    # -- progress lines --------------------------------------------------------------------

    def __enter__(self):
        if self.resumed:
            self.say(f'resuming {self.path}: {self.resumed} of {len(self.units)} measurements '
                     'are kept from before and not measured again')
        if self.interval > 0:
            self._quit = threading.Event()
            self._ticker = threading.Thread(target=self._tick, name='study-progress',
                                            daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc):
        if self._ticker is not None:
            self._quit.set()
            self._ticker.join(timeout=5)
            self._ticker = None
        self.close()
        return False

    def _tick(self):
        while not self._quit.wait(self.interval):
            line = self.progress_line()
            if line:
                self.say(line)

    def progress_line(self):
        """What is being measured, for how long, and the time left; None between units."""
        with self._lock:
            unit, started = self._current, self._started
        if unit is None or time.monotonic() - started < 1.0:  # nothing to add to its first line
            return None
        left = self.left()
        index = self.units.index(unit) + 1
        return (f'  measuring [{index}/{len(self.units)}] {unit.label}: '
                f'{duration(time.monotonic() - started)} so far'
                + (f', about {duration(left)} left in the run' if left is not None else ''))

    def describe(self):
        """``N of M measurements in PATH``: what the file holds."""
        return f'{len(self.done)} of {len(self.units)} measurements in {self.path}'

"""A profile of chosen steps: MXNet's profiler over steps START to STOP, written as a trace.

``Profile`` is a hook of ``train``. Steps count from 1 across epochs (step ``s`` of epoch
``e`` is ``(e - 1) * len(train_iter) + s``). The profiler runs from the moment step START - 1
has finished on every device until step STOP has (``npx.waitall()`` at both ends), and not
during an evaluation, so the trace holds those steps' operators and no others. MXNet writes
Chrome's JSON trace format (Perfetto reads it too); ``device_trace`` gives each device a track
of its own, named as the package names it (``cpu(0)``); the file is replaced whole. MXNet's
dump never reaches a disk: it is read through a pipe (``filesafety.foreign``), and a dump that
cannot be read whole, like a trace that cannot be written, is an ``OSError`` naming the trace.
When the profile ends, the ten costliest operators are printed. A run that stops or fails
inside the range writes what was profiled, and says so. Without a ``Profile`` the profiler
stays off. CPU contexts past the process's cores are refused: MXNet 1.9.1's profiler cannot
tell them apart (``check_devices``).
"""
import json
import numbers
import os
import re
import sys

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import npx

from ..base import engine
from ..filesafety import atomic, foreign
from ..filesafety.paths import check_argument, check_default_output, check_name, resolve_output
from ..errors import GluonMultiGPUError
from .hooks import Hook
from .traces import cost_table, costliest, device_trace, read_events

__all__ = ['Profile', 'parse_steps', 'check_path', 'check_default', 'check_devices',
           'read_events', 'device_trace', 'costliest', 'cost_table',
           'DEFAULT_FILE', 'TRACE_FORMAT', 'TRACE_MARKER']

#: What MXNet's profiler is given as its file while no dump is taken: a path below /dev/null,
#: which MXNet can neither remove (as it does the file it is given) nor write to at the
#: process's end.
_NOWHERE = os.path.join(os.devnull, 'mxnet')
#: Where the trace goes when no file is named.
DEFAULT_FILE = 'profile.json'
#: A trace's ``otherData.format``, its first field: how the package knows a trace of its own.
TRACE_FORMAT = 'gluon-multigpu profile 1'
#: How a trace of the package's begins (``Profile`` writes ``otherData`` first).
TRACE_MARKER = b'{"otherData":{"format":"' + TRACE_FORMAT.encode() + b'"'
_HINT = ('give START:STOP, the first and last step to profile, counted from 1 across epochs '
         '(e.g. 11:20)')


def parse_steps(steps):
    """``(start, stop)`` of ``steps``: ``'START:STOP'`` (``'N'``: one step; ASCII digits) or a
    pair of ints.

    Raises ``GluonMultiGPUError`` naming `profile` for anything else, for a step 0 and for a
    STOP before START.
    """
    # ASCII digits only: int() also reads full-width and other scripts' digits
    if isinstance(steps, str) and (found := re.fullmatch(
            r'\s*([0-9]{1,18})\s*(?::\s*([0-9]{1,18})\s*)?', steps.strip(), re.ASCII)):
        start, stop = int(found[1]), int(found[2] or found[1])
    elif isinstance(steps, (tuple, list)) and len(steps) == 2 and all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in steps):
        start, stop = (int(s) for s in steps)
    else:
        raise GluonMultiGPUError(f'`profile` {steps!r} is not a range of steps; {_HINT}')
    if start < 1:
        raise GluonMultiGPUError(f'`profile` {start}:{stop}: steps count from 1; {_HINT}')
    if stop < start:
        raise GluonMultiGPUError(f'`profile` {start}:{stop}: STOP is before START; {_HINT}')
    return start, stop


def check_path(path):
    """The file the trace of ``path`` is written to (its links followed); raise
    ``GluonMultiGPUError`` if it cannot be one (a folder, a device, a missing folder)."""
    target = resolve_output(check_argument(path, 'profile_file', False), '`profile_file`')
    if os.path.lexists(target) and not os.path.isfile(target):
        raise GluonMultiGPUError(f'`profile_file` {path} is not a regular file; give the name of '
                                 'a file')
    check_name(target, f'`profile_file` {path}')
    return target


def check_default(path=DEFAULT_FILE):
    """Raise ``GluonMultiGPUError`` unless the trace may go to ``path``, a file the user did not
    name: nothing there, or a trace the package wrote (it begins with ``TRACE_MARKER``)."""
    return check_default_output(path, 'the `profile` trace', TRACE_MARKER,
                                "name the trace's file (`profile_file`), or move it away")


def check_devices(devices):
    """Raise ``GluonMultiGPUError`` if MXNet's profiler cannot keep each of ``devices`` apart.

    It files a CPU context's operators by its number among the process's cores: past them,
    under the pinned-memory device, then the process ends (MXNet 1.9.1).
    """
    cores = engine.cores()  # the CPU devices MXNet's profiler tells apart
    beyond = [d for d in devices if d.device_type == 'cpu' and d.device_id >= cores]
    if beyond:
        raise GluonMultiGPUError(
            f'`profile`: MXNet\'s profiler tells apart as many CPU contexts as this process has '
            f'cores ({cores}), and {beyond[0]} is past them (its operators would be filed under '
            f'another device, or end the process); profile with `cpu_devices` {cores} or fewer')


def _dump():
    """Have MXNet's profiler write what it recorded since its last dump to its file, then name
    a file it can neither create nor write to (its pipe is about to close)."""
    mx.profiler.dump(finished=False)  # (finished=True: no profile again in this process)
    mx.profiler.set_config(profile_all=False, filename=_NOWHERE)


class Profile(Hook):
    """Profile steps START to STOP of a run into a trace file (``train``'s ``profile``).

    Steps count from 1 across epochs. A stop or an error inside the range writes the steps
    profiled and says so; a run resumed past START profiles from the step after the resume,
    past STOP nothing.

    Parameters
    ----------
    steps : str or tuple
        ``'START:STOP'`` (``'N'``: step N alone), ``(start, stop)`` or ``(start, stop,
        path)``: the first and the last step profiled (START at least 1, STOP not before it).
    path : str or os.PathLike, optional
        The trace file (Chrome's JSON trace format, replaced whole); its folder must exist.
        None: ``DEFAULT_FILE``, which replaces only a trace of the package's
        (``check_default``).
    out : file, optional
        The text stream that gets the table of the ten costliest operators (None:
        ``sys.stdout``).

    Attributes
    ----------
    written : (int, int) or None
        The first and last step the trace covers, once written.
    rows : list of (str, int, float, float) or None
        The costliest operators, once written (``costliest``: name, calls, milliseconds,
        share of all operators' time).
    """

    def __init__(self, steps, path=None, out=None):
        if isinstance(steps, (tuple, list)) and len(steps) == 3:
            steps, path = tuple(steps[:2]), steps[2]
        self.start, self.stop = parse_steps(steps)
        self.path = os.fspath(path) if isinstance(path, os.PathLike) else (
            DEFAULT_FILE if path is None else path)
        check_path(self.path)
        if path is None:  # a file the user did not name: never one the package did not write
            check_default(self.path)
        if not foreign.available():
            raise GluonMultiGPUError('`profile` reads MXNet\'s profiler through /proc/self/fd, '
                                     'which this system does not have; mount /proc, or drop '
                                     '`profile`')
        self._file = os.path.abspath(self.path)  # as named now, whatever the folder later
        self.out, self.written, self.rows = out, None, None
        self._state = 'waiting'  # then 'on' ('paused' between two epochs of the range), 'done'
        self._from = self.start  # the first step to profile (later, after a resume past START)
        self._next = None  # the step that comes next, where known
        self._first = self._last = None  # the steps profiled so far
        self._per_epoch, self._note, self._capture = None, '', None

    def check_total(self, total, per_epoch=None):
        """Raise ``GluonMultiGPUError`` if the range ends past ``total``, the run's last step
        (``per_epoch``: its steps per epoch, for the message)."""
        if self.stop > total:
            of = f' ({total // per_epoch} epoch(s) of {per_epoch} steps)' if per_epoch else ''
            raise GluonMultiGPUError(f'`profile` {self.start}:{self.stop} ends past the run\'s '
                                     f'last step, {total}{of}; give a STOP of {total} or less')

    def setup(self, run):
        check_devices(run.devices)

    def enter(self, run):
        if self._state == 'done':
            return
        self._per_epoch = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
        if self._per_epoch is None and run.num_epochs > 1:
            raise GluonMultiGPUError('`profile` counts steps across epochs: give training data '
                                     'that has a length (a list, a DataLoader), or one epoch')
        if self._per_epoch is not None:
            self.check_total(run.num_epochs * self._per_epoch, self._per_epoch)
        if self._state == 'waiting' and self._next == self._from:  # a fit that goes on
            self._start()

    def begin(self, run):
        self._reached(1, None)  # a run from its first step (a resumed one does not get here)

    def step_end(self, run, step, samples, timer):
        done = (run.epoch - 1) * (self._per_epoch or 0) + step
        if self._state == 'on' and self._first is None and done != self._from:
            self._close(keep=False)  # the run went on from elsewhere (a resume): start again
        if self._state == 'on':
            self._first, self._last = self._first or done, done
            if done >= self.stop:
                self._end(run)
            elif self._per_epoch and step >= self._per_epoch:
                self._switch('stop', 'paused')  # the evaluation between two epochs is no step
        elif self._state == 'waiting':
            if self._next != done and done >= self._from:
                self._resumed_past(done)
            self._reached(done + 1, step)

    def epoch_end(self, run, record):
        if self._per_epoch is None or self._state not in ('waiting', 'paused'):
            return
        self._next = run.epoch * self._per_epoch + 1
        if run.epoch >= run.num_epochs:
            return  # the next step is another fit's
        if self._state == 'paused':
            self._switch('run', 'on')
        elif self._next == self._from:
            self._start()

    def leave(self, run):
        if self._state not in ('on', 'paused'):
            return
        steps = getattr(run, 'steps', None)  # the epoch in progress: a hook before this one
        if steps is not None and run.error is not None:  # may have failed in its last step
            queued = (run.epoch - 1) * (self._per_epoch or 0) + steps.first_step - 1 + steps.batches
            if queued >= self._from:
                self._first, self._last = self._first or self._from, max(self._last or 0, queued)
        if self._first is None:
            self._close(keep=False)  # nothing profiled yet: the next fit starts again
        else:
            self._end(run, ended=run.error)

    def _reached(self, coming, step):
        """Step ``coming`` is next (after step ``step`` of an epoch; None: at a run's start)."""
        self._next = coming
        last_of_epoch = step is not None and self._per_epoch and step >= self._per_epoch
        if self._state == 'waiting' and coming == self._from and not last_of_epoch:
            self._start()

    def _resumed_past(self, done):
        """The first step of a resumed run, ``done``, was START or past it: it could not be
        profiled (nothing tells a hook where a run resumes before its first step)."""
        if done >= self.stop:
            self._state = 'done'
            self._say([f'profile {self.start}:{self.stop}: the run resumed at step {done}, '
                       'past the range: nothing profiled'])
        else:
            self._from, self._note = done + 1, f'the run resumed at step {done}; '

    def _start(self):
        npx.waitall()  # Sync point: the steps before are done, and none of their operators is in
        # MXNet's file is a pipe (``foreign``), named now: a later change of the profiler's
        # settings, before its dump, loses some of what it recorded.
        self._capture = foreign.Capture(self._file, "MXNet's profiler")
        try:
            # With its statistics on, MXNet's engine runs operators one by one, not in bulks
            # (one "ImperativeBulk" event for many): each is in the trace by its name.
            mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                                   filename=self._capture.path)
            self._switch('run', 'on')
        except BaseException:
            self._release()
            raise

    def _switch(self, state, ours):
        npx.waitall()  # Sync point: what was queued before is in (or out of) the profile whole
        mx.profiler.set_state(state)
        self._state = ours

    def _close(self, keep=True):
        """Stop the profiler and take MXNet's dump; return its events (``keep``) or drop them."""
        try:
            npx.waitall()  # Sync point: the last step is done, all of its operators are in
            mx.profiler.set_state('stop')  # (where waitall raises, _release stops it)
            # The dump empties MXNet's record: taken also when dropped, through the pipe: none
            # of it reaches a disk, none is left by a kill.
            events = self._capture.take(_dump, parse=(
                lambda data: read_events(data.decode('utf-8'))) if keep else bytes)
        finally:
            self._release()
            if not keep:
                self._first = self._last = None
        return events if keep else None

    def _release(self):
        """Leave MXNet's profiler off, its statistics dropped, its file nowhere."""
        capture, self._capture, self._state = self._capture, None, 'waiting'
        try:
            mx.profiler.set_state('stop')
            mx.profiler.set_config(profile_all=False, filename=_NOWHERE)
        except BaseException:
            capture = None  # the profiler may still name the pipe: kept open, never reused
            raise
        finally:
            if capture is not None:
                capture.close()

    def _end(self, run, ended=None):
        """Close the profile, write its trace and print its costliest operators."""
        events = self._close()
        self._state = 'done'
        devices = [str(d) for d in run.devices]
        gpus = 32 if mx.runtime.Features().is_enabled('CUDA') else 0  # what MXNet's profiler knows
        first, last = self._first, self._last
        trace = {'otherData': {'format': TRACE_FORMAT, 'steps': f'{self.start}:{self.stop}',
                               'profiled': f'{first}:{last}', 'devices': ', '.join(devices)},
                 # its format first: TRACE_MARKER
                 **device_trace(events, devices, engine.cores(), gpus=gpus)}
        with atomic.atomic_write(self._file) as f:
            json.dump(trace, f, separators=(',', ':'))
        self.written, self.rows = (first, last), costliest(trace)
        why = ''
        if last < self.stop:
            how = ('ended' if ended is None else 'stopped' if not isinstance(ended, Exception)
                   else f'failed ({type(ended).__name__})')
            why = f' ({self._note}the run {how} after step {last}, before step {self.stop})'
        elif self._note:
            why = f' ({self._note.rstrip("; ")})'
        self._say([f'profile of steps {first}-{last}{why} on {", ".join(devices)}: written to '
                   f'{self.path} (Chrome trace JSON: Perfetto, chrome://tracing); its '
                   f'{"ten" if len(self.rows) == 10 else len(self.rows)} costliest operators:',
                   *cost_table(self.rows)])

    def _say(self, lines):
        print(*lines, sep='\n', file=self.out or sys.stdout, flush=True)

"""Waits on what a process has done (read from /proc) or on any condition: no sleep stands in for
an event.

A test that signals a program at a given moment of its start (while MXNet
loads) waits until the program has reached it: its handler of the signal is in
place (``SigCgt`` of /proc/PID/status), or MXNet's library is mapped.

A test that bounds how long something took (a stop, a detection) gives its
room beyond the feature's own times through ``Load``: the room a quiet machine
needs, times how much slower this machine runs now, measured.
"""
import os
import time


def _status_mask(pid, field):
    with open(f'/proc/{pid}/status', encoding='ascii') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1], 16)
    return 0


def handles(pid, signum):
    """Whether process ``pid`` handles ``signum`` itself (neither default nor ignored)."""
    return bool(_status_mask(pid, 'SigCgt') >> (signum - 1) & 1)


def has_mapped(pid, name):
    """Whether process ``pid`` has a file whose path contains ``name`` mapped (a loaded library)."""
    with open(f'/proc/{pid}/maps', encoding='utf-8', errors='replace') as f:
        return any(name in line for line in f)


def wait_until(proc, what, check, timeout=120, interval=0.005):
    """Poll ``check()`` every ``interval`` s until it is true; fail if ``proc`` (None: no
    process) ends first or ``timeout`` s pass, naming ``what`` was awaited (``what`` may be a
    function, called for the text when the wait fails)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f'the process ended (status {proc.returncode}) before '
                                 f'{what() if callable(what) else what}')
        try:
            if check():
                return
        except FileNotFoundError:  # gone between poll and read: reported above next time
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f'not {what() if callable(what) else what} within {timeout} s')
        time.sleep(interval)  # a polling interval, not an ordering: the check decides


def cmdline(pid):
    """The command line of process ``pid``, its arguments joined by spaces ('' if gone)."""
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace')
    except OSError:
        return ''


def cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_share(seconds=0.3):
    """The share of one core a thread that asks for all of it gets here now, measured over
    ``seconds``: 1.0 on a quiet machine, 0.6 or so beside two busy processes on two cores, 0.1
    where 20 runnable processes share two."""
    began, cpu = time.monotonic(), time.thread_time()
    while time.monotonic() - began < seconds:
        pass
    return (time.thread_time() - cpu) / (time.monotonic() - began)


class Load:
    """How much slower than a quiet machine this one runs now, measured when made.

    ``factor`` (at least 1) is the larger of: the wall time a busy loop of this
    thread takes over the CPU time it gets (the load now), and the one-minute
    load average over the cores (the load of the last minute, which the
    awaited event fell in). ``room(seconds)`` scales the room a quiet machine
    needs by it; ``str()`` says what was measured, for a failure's message:
    past a scaled room, the figures tell whether the machine was busy.
    """

    def __init__(self):
        self.share = cpu_share()
        self.cores = cores()
        try:
            self.average = os.getloadavg()[0]
        except OSError:  # a system that does not say
            self.average = 0.0
        self.factor = max(1.0, 1.0 / max(self.share, 0.01), self.average / self.cores)

    def room(self, seconds):
        """``seconds`` of room on a quiet machine, on this one now."""
        return seconds * self.factor

    def __str__(self):
        return (f"this machine's load: a busy thread got {self.share:.2f} of a core, load "
                f"average {self.average:.1f} on {self.cores} core(s): room scaled by "
                f"{self.factor:.1f}")


#: The environment variable a test gives a program to find every process of its tree by
#: (``marked``): each descendant inherits it, one that left the tree (a daemon, an orphan) too.
MARK = 'GLUON_MULTIGPU_TEST_TREE'


def marked(tag):
    """The live processes whose environment holds ``MARK=tag`` (from /proc)."""
    found, entry = [], f'{MARK}={tag}'.encode()
    for name in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{name}/environ', 'rb') as f:
                if entry in f.read().split(b'\0'):
                    found.append(int(name))
        except OSError:  # gone, or not ours to read
            continue
    return found

"""Waits on what a process has done (read from /proc) or on any condition: no sleep stands in for
an event.

A test that signals a program at a given moment of its start (while MXNet
loads) waits until the program has reached it: its handler of the signal is in
place (``SigCgt`` of /proc/PID/status), or MXNet's library is mapped.
"""
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

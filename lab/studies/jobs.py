"""What the lab's studies (``failover``, ``network``) share: their error, the launcher as a
child stopped in order, the machine they ran on, and their estimates as words."""
import contextlib
import os
import signal
import subprocess
import time

from gluon_multigpu.base.machine import machine  # noqa: F401  (the lab's studies record it)

__all__ = ['StudyError', 'stop_launcher', 'machine', 'duration']


class StudyError(Exception):
    """The study cannot run here, or a run could not be made: one line."""


def stop_launcher(proc):
    """End a launcher started in a session of its own: SIGTERM (its ordered stop), SIGTERM again
    (every process at once), then SIGKILL after 10 s."""
    for _ in range(2):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            time.sleep(0.2)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def duration(seconds):
    """An estimate's ``seconds`` as words: ``45 s``, ``12 min``."""
    return f'{seconds:.0f} s' if seconds < 90 else f'{seconds / 60:.0f} min'

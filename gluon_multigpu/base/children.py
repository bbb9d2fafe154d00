"""The package's child processes end with the process that started them, however it ends.

Every child a command of the package starts (the doctor's probe, the launcher's
agents, an agent's keeper's command) asks the kernel, before its program runs,
for a signal when its parent dies (Linux's ``PR_SET_PDEATHSIG``; nothing is
asked elsewhere). A parent that died before the child asked is seen at once,
and the child ends there. The rule: no process outlives its job.
"""
import ctypes
import os
import signal

__all__ = ['on_parent_death', 'dying_with_parent']

_PR_SET_PDEATHSIG = 1
#: libc's ``prctl``, looked up once in the parent: a child between fork and exec only calls it.
_PRCTL = {}


def _prctl():
    if 'call' not in _PRCTL:
        try:
            _PRCTL['call'] = ctypes.CDLL(None).prctl
        except (OSError, AttributeError):  # no libc with prctl: not Linux
            _PRCTL['call'] = None
    return _PRCTL['call']


def on_parent_death(signum):
    """In a child before it runs its program: ``signum`` when its parent dies (Linux's
    ``PR_SET_PDEATHSIG``; nothing where there is none)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(signum))


def dying_with_parent(signum=signal.SIGKILL, first=None):
    """A ``preexec_fn`` for ``subprocess``: the child calls ``first`` (if given), then asks for
    ``signum`` when this process, its parent, dies; if its parent died already (between the
    fork and the request, which the kernel would not report), it ends at once (SIGKILL:
    nothing of it has run yet)."""
    parent, _ = os.getpid(), _prctl()

    def preexec():
        if first is not None:
            first()
        on_parent_death(signum)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec

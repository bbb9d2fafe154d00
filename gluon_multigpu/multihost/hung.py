"""A hung job: no worker queued a step for the stall time; which worker is behind, in words.

The workers report every step they queue (``observe.stall.StepReports``), ``rest``
while an epoch's steps are done (the first worker evaluates, the others wait
for it), and the stall time their command asked for (``stall S``). A job is
hung when none of its running workers is resting and none has queued a step
for the stall time (the launcher's own, or the shortest the workers asked
for): with synchronous workers the one that stopped holds the others at the
next step, so the worker with the fewest steps is the one behind (``find``).
The launcher then asks every process for its Python stack, says this
module's line, and stops the job with status ``STALLED``.
"""
import time
from typing import NamedTuple

from ..observe.stall import STALLED

__all__ = ['STALLED', 'DUMP_WAIT', 'Stall', 'stall_seconds', 'find']

#: Seconds the launcher gives the processes to write their stacks before it stops them.
DUMP_WAIT = 1.0


class Stall(NamedTuple):
    """The workers behind (the fewest steps), the others, and the stall time, in seconds."""
    behind: list
    others: list
    seconds: float

    def describe(self):
        """The launcher's line for it (without ``launch: ``)."""
        several = len(self.behind) > 1
        names = ' and '.join(r.label for r in self.behind)
        line = f'{names} {"are" if several else "is"} stuck in step {self.behind[0].steps + 1}: '
        line += (f'no worker queued a step for {self.seconds:g} s' if self.others or several
                 else f'it queued no step for {self.seconds:g} s')
        if self.others:
            waiting = ', '.join(f'{r.label} after step {r.steps}' for r in self.others)
            line += f', and the other workers wait for {"them" if several else "it"} ({waiting})'
        elif several:
            line += (', and none is behind the others: what they wait for may be a server, the '
                     'scheduler or the network')
        return line + "; every worker's Python stack is in its output; stopping the job"


def stall_seconds(settings, workers):
    """The stall time: the launcher's step timeout or the shortest the workers asked for,
    whichever is shorter (0: no watch)."""
    return min((t for t in (settings.step_timeout, *(r.stall for r in workers)) if t), default=0.0)


def find(workers, seconds, now=None):
    """The ``Stall`` of ``workers`` (``plan.Role``) if none queued a step for ``seconds``, else
    None. Only running workers count, and only once one has queued a step; a worker that
    queued none is at step 0; a resting worker (its epoch's end) means no stall."""
    watched = [r for r in workers if r.running() and not r.lost and not r.hung and r.status is None]
    stepped = [r.stepped for r in watched if r.stepped is not None]
    if not seconds or not stepped or any(r.resting for r in watched) or \
            (time.monotonic() if now is None else now) - max(stepped) <= seconds:
        return None
    low = min(r.steps for r in watched)
    return Stall([r for r in watched if r.steps == low], [r for r in watched if r.steps > low],
                 seconds)

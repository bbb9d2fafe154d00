"""The learning rate of each update of a run: a schedule that MXNet's optimizer calls.

It loads no MXNet: a parameter server's servers unpickle it with the
optimizer while MXNet is still loading.
"""
import math

__all__ = ['Schedule']


class Schedule:
    """The learning rate of each update: ``constant``, ``step``, ``cosine`` or ``onecycle``.

    ``rate(k)`` is the rate of update ``k`` (1-based) of ``total``; the first
    ``warmup`` updates rise linearly to ``lr``. ``step`` divides by 10 at half
    and at three quarters of the updates after the warm-up, ``cosine`` falls
    to 0 along a half cosine, ``onecycle`` rises from ``lr / 25`` over its
    warm-up (a third of the updates without one) and falls along a half cosine
    to ``lr / 10**4``. MXNet's optimizer calls it with its count of updates.
    (No MXNet here: a parameter server's servers unpickle it while MXNet loads.)

    Parameters
    ----------
    name : {'constant', 'step', 'cosine', 'onecycle'}
        The shape of the schedule (``values.SCHEDULES``).
    lr : float
        The learning rate the schedule is made of: its rate after the warm-up (``onecycle``:
        its peak).
    warmup : int
        Updates over which the rate rises linearly to ``lr`` (0: none).
    total : int, optional
        Updates of the whole run; ``train`` sets it once the run's epochs are known. None:
        update ``k`` is taken as the last of ``k`` updates.
    """

    def __init__(self, name, lr, warmup=0, total=None):
        self.base_lr = lr  # (MXNet's optimizer sets it to its rate: the same)
        self.name, self.lr, self.warmup, self.total = name, lr, warmup, total

    def __call__(self, num_update):
        return self.rate(max(num_update, 1))

    def rate(self, k):
        """The rate of update ``k`` (1-based)."""
        total, t, lr = self.total or k, k - 1, self.lr
        if self.name == 'onecycle':
            ramp = self.warmup or max(1, total // 3)
            if t < ramp:
                return lr / 25 + (lr - lr / 25) * t / ramp
            p = min((t - ramp) / max(1, total - ramp), 1.0)
            return lr / 1e4 + (lr - lr / 1e4) * 0.5 * (1 + math.cos(math.pi * p))
        if t < self.warmup:
            return lr * (t + 1) / self.warmup
        p = min((t - self.warmup) / max(1, total - self.warmup), 1.0)
        if self.name == 'step':
            return lr * 0.1 ** ((p >= 0.5) + (p >= 0.75))
        if self.name == 'cosine':
            return lr * 0.5 * (1 + math.cos(math.pi * p))
        return lr

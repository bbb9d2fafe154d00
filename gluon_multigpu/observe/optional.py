"""The hooks a run's optional arguments add: metrics for a dashboard, a profile, a stall watch.

Each lives in its own module, loaded only when its argument is given: a run
that uses none of them loads and runs nothing of theirs.
"""

__all__ = ['optional_hooks']


def optional_hooks(tensorboard=None, metrics=None, log_every=50, profile=None, stall_timeout=None):
    """The hooks of ``Training``'s arguments of the same names (none given: none)."""
    # pylint: disable=import-outside-toplevel  (each loaded only when asked for)
    hooks = []
    if tensorboard is not None or metrics is not None:
        from .metrics import Metrics
        hooks.append(Metrics(tensorboard=tensorboard, path=metrics, every=log_every))
    if profile is not None:
        from .profile import Profile
        hooks.append(Profile(profile))  # (start, stop, path) too
    if stall_timeout is not None:
        from .stall import stall_hook
        hooks.append(stall_hook(stall_timeout))  # (checked; None for 0, which watches nothing)
    return [hook for hook in hooks if hook is not None]

"""The hooks ``train`` adds to the caller's: those of its optional arguments (metrics for a
dashboard, a profile, a stall watch), ``on_epoch``'s, and what a notebook needs (Ctrl-C, a
live display).

Each optional one lives in its own module, loaded only when its argument is given: a run
that uses none of them loads and runs nothing of theirs.
"""
from .hooks import Hook
from .interrupt import Interruptible
from .live import Live

__all__ = ['optional_hooks']


class _EpochCallback(Hook):
    """The ``on_epoch`` argument of ``train`` as a hook."""

    def __init__(self, on_epoch):
        self.on_epoch = on_epoch

    def epoch_end(self, run, record):
        self.on_epoch(record)


def optional_hooks(hooks, config, on_epoch=None):
    """``hooks`` and those ``train`` adds after them: the hooks of ``config``'s (a
    ``TrainConfig``) ``tensorboard``, ``metrics``, ``profile`` and ``stall_timeout`` (none
    given: none), ``on_epoch`` as a hook, then Ctrl-C that stops after a step and a live
    display (its lines on a terminal every ``progress_interval`` s; 0: none).

    The last two only where the hooks do neither themselves (the scripts bring their own).
    """
    # pylint: disable=import-outside-toplevel  (each loaded only when asked for)
    hooks = list(hooks)
    if config.tensorboard is not None or config.metrics is not None:
        from .metrics import Metrics
        hooks.append(Metrics(tensorboard=config.tensorboard, path=config.metrics,
                             every=config.log_every))
    if config.profile is not None:
        from .profile import Profile
        hooks.append(Profile(config.profile))  # (start, stop, path) too
    if config.stall_timeout is not None:
        from .stall import stall_hook
        # (checked; None for 0, which watches nothing)
        hooks += filter(None, [stall_hook(config.stall_timeout)])
    hooks += [_EpochCallback(on_epoch)] if on_epoch else []
    if not any(getattr(h, 'handles_signals', False) for h in hooks):
        hooks.append(Interruptible())
    if config.progress_interval and not any(getattr(h, 'shows_progress', False) for h in hooks):
        hooks.append(Live(line_interval=config.progress_interval))
    return hooks

"""Observability and control: what watches a run, and what stops it.

``hooks`` (``Hook`` and ``Run``: what observers and controllers plug into),
``metrics`` (TensorBoard and a metrics file), ``profile`` (MXNet's profiler),
``stall`` (steps that stop finishing), ``live`` (a notebook's display),
``progress`` (the programs' progress lines), ``interrupt`` (Ctrl-C after a
step), ``stopping`` (``StopRequest``, ``StallGuard``, the lines a run says when
it stops) and ``optional`` (the hooks ``train`` adds: its settings', ``on_epoch``'s,
Ctrl-C's and the display's).
"""

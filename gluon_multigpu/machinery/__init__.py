"""The training machinery around the section's loop: ``train`` and what it runs on.

``training`` (the fit loop: ``Training``, ``train``), ``updates`` and
``schedule`` (accumulation, clipping, learning-rate schedules), ``pushers``
(a thread per device that queues its passes), ``checks`` (the batches checked
as the loop takes them: ``BatchCheck``), ``config`` (``TrainConfig`` and
``RunConfig``, a run's settings in one object).
"""

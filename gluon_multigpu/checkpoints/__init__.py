"""Checkpoints: ``checkpoint`` (``Checkpointer``, the hook that saves and resumes), with
``checkpoint_store`` (the files read and checked, or replaced whole), ``manifest``, ``states``
(the optimizer's state as an array file) and ``savefolder`` (the checkpoint folder itself)."""

"""Imported first by every module that uses MXNet: engine settings, then MXNet in NumPy mode.

``runtime.apply_engine_env()`` puts the settings that do not depend on the
number of devices into the environment (never over a value already there)
before MXNet is imported; scripts that know their device count call it with
``num_cpu_devices`` earlier still. Then ``npx.set_np()``, as the book does.
"""
from . import runtime

runtime.apply_engine_env()

# pylint: disable=wrong-import-position
from mxnet import npx  # noqa: E402

npx.set_np()

"""What the lab's programs share, by one name: ``common.int_in``, ``common.start``, ``common.stopping_main``.

Each piece lives in the package's module of its responsibility (``gluon_multigpu.cli``),
and is named here too, so that a lab program imports what it shares from one place:

- ``arguments``: argument types and parsers, the device and run flags,
  ``error_line`` and ``flag`` (how an error names the flags);
- ``console``: the start of a program (engine settings before MXNet loads,
  the handlers until its own), quiet console streams, how it was started
  (``program``, ``command_line``), and its ``stop_request``;
- ``messages``: what the programs say when they stop.

Nothing in this module loads MXNet.
"""
from gluon_multigpu.base.engine import cores
from gluon_multigpu.errors import flag
from gluon_multigpu.cli.arguments import (MAX_CPU_DEVICES, MAX_SEED, OneLineParser, UsageError,
                                          add_data_flags, add_device_flags, add_run_flags,
                                          add_sweep_flags, batch_size, engine_devices, error_line,
                                          int_in, non_negative_float, num_epochs, path_of,
                                          positive_float, script_parser, seed, split_weights,
                                          sweep_parser)
from gluon_multigpu.cli.console import (apply_engine_settings, command_line, prepare_engine,
                                        program, quiet_console, resume_command, say_quietly, start,
                                        started, stop_request, stopping_main)
from gluon_multigpu.cli.messages import partial_heading

__all__ = [name for name in dir() if not name.startswith('_')]  # the names imported above

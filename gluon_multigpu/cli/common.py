"""What the programs share, by one name: ``common.int_in``, ``common.start``, ``common.sweep_main``.

Each piece lives in the module of its responsibility, and is named here too,
so that a program imports what it shares from one place:

- ``arguments``: argument types and parsers, the device and run flags,
  ``FLAGS`` and ``error_line`` (how an error names the flags);
- ``console``: the start of a program (engine settings before MXNet loads,
  the handlers until its own), quiet console streams, how it was started
  (``program``, ``command_line``), and its ``stop_request``;
- ``sweeps``: the mains of the measuring programs and the sweep they keep;
- ``messages``: what the programs say when they stop.

Nothing in this module loads MXNet.
"""
from ..base.signals import STOP_SIGNALS
from .arguments import (FLAGS, MAX_CPU_DEVICES, MAX_GPUS, MAX_SEED, OneLineParser, UsageError,
                        add_data_flags, add_device_flags, add_run_flags, add_sweep_flags,
                        batch_size, engine_devices, error_line, int_in, non_negative_float,
                        num_epochs, path_of, positive_float, script_parser, seed, split_weights,
                        sweep_parser)
from .console import (CHECKOUT_SCRIPTS, apply_engine_settings, command_line, cores,
                      prepare_engine, program, quiet_console, resume_command, run_began,
                      say_quietly, start, started, stop_request)
from .messages import partial_heading
from .sweeps import (MEMORY_VARIABLE, available_memory, data_root, in_out_folder,
                     measure_sweep, results_output, run_main, stopping_main, sweep_main)

__all__ = ['STOP_SIGNALS', 'FLAGS', 'MAX_CPU_DEVICES', 'MAX_GPUS', 'MAX_SEED', 'OneLineParser',
           'UsageError', 'add_data_flags', 'add_device_flags', 'add_run_flags', 'add_sweep_flags',
           'batch_size', 'engine_devices', 'error_line', 'int_in', 'non_negative_float',
           'num_epochs', 'path_of', 'positive_float', 'script_parser', 'seed', 'split_weights',
           'sweep_parser', 'CHECKOUT_SCRIPTS', 'apply_engine_settings', 'command_line', 'cores',
           'prepare_engine', 'program', 'quiet_console', 'resume_command', 'run_began',
           'say_quietly', 'start', 'started', 'stop_request', 'partial_heading',
           'MEMORY_VARIABLE', 'available_memory', 'data_root', 'in_out_folder', 'measure_sweep',
           'results_output', 'run_main', 'stopping_main', 'sweep_main']

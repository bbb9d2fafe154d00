"""gluon-multigpu: data-parallel training with MXNet Gluon, after d2l's
"Concise Implementation for Multiple GPUs".

The modules follow the section: ``devices`` (device lists, splitting a batch),
``model`` (ResNet-18, the simple CNN), ``data`` (Fashion-MNIST/MNIST),
``kvstores`` (the Trainer and where gradients are summed), ``balance`` (how a
batch is shared among devices of different speed), ``precision`` (float16
with loss scaling), ``sync_bn`` (synchronised BatchNorm), ``training`` (one
step, one epoch, evaluation, ``train`` and its hooks), ``results`` (what it returns), ``book`` (the text's
loop), ``checkpoint`` (crash-safe checkpoints), ``stopping`` (stop on a signal),
``compare`` (runs that differ in their kvstore), ``reporting`` (lines,
tables, charts, reports), ``files`` (atomic writes, JSON, CSV), ``measure``
(timing one synchronisation, one step, a sweep of runs), ``scaling`` (the
arithmetic of bandwidth, speedup and the projection) and ``scaling_report``.

Importing the package imports MXNet and turns on its NumPy semantics
(``npx.set_np()``), as the book does. MXNet reads ``OMP_NUM_THREADS`` when it
loads: set engine variables before importing the package (the scripts do,
from their device flags; see ``scripts/_cli.py``).
"""
from mxnet import npx

npx.set_np()

# pylint: disable=wrong-import-position
from . import (balance, book, checkpoint, compare, data, devices, distributed,  # noqa: E402
               errors, files, kvstores, manifest, measure, model, precision, reporting, results,
               scaling, scaling_report, states, stopping, sync_bn, training, utils)
from .book import evaluate_accuracy_book, train_book  # noqa: E402
from .checkpoint import Checkpointer  # noqa: E402
from .compare import ParamTracker, device_spread, recommend  # noqa: E402
from .data import (DATASETS, ArrayLoader, load_data, load_data_fashion_mnist,  # noqa: E402
                   load_data_mnist, read_idx, read_split)
from .devices import (cpu_devices, gpu_devices, num_gpus, split_batch, try_all_gpus,  # noqa: E402
                      try_gpu)
from .errors import (CheckpointError, DataError, DeviceError, GluonMultiGPUError,  # noqa: E402
                     Interrupted, TrainingDiverged)
from .files import write_json  # noqa: E402
from .kvstores import KVSTORES  # noqa: E402
from .model import (MODELS, HybridResidual, Residual, count_flops, default_initializer,  # noqa: E402
                    get_model, hybrid_resnet18, resnet18, simple_cnn)
from .stopping import StallGuard, StopRequest  # noqa: E402
from .reporting import (Animator, Progress, bar_chart, comparison_table,  # noqa: E402
                        epoch_line, write_kvstore_report)
from .results import EpochRecord, TrainResult  # noqa: E402
from .training import Hook, evaluate_accuracy_gpus, train, train_batch, train_epoch  # noqa: E402
from .utils import Accumulator, Timer, accuracy  # noqa: E402

__version__ = '0.1.0'

__all__ = ['balance', 'book', 'checkpoint', 'compare', 'data', 'devices', 'distributed', 'errors',
           'files', 'kvstores', 'manifest', 'measure', 'model', 'precision', 'reporting', 'results',
           'scaling', 'scaling_report', 'stopping', 'sync_bn', 'training', 'utils',
           'evaluate_accuracy_book', 'train_book', 'Checkpointer', 'StopRequest', 'StallGuard', 'ParamTracker',
           'device_spread', 'recommend', 'DATASETS', 'ArrayLoader', 'load_data',
           'load_data_fashion_mnist', 'load_data_mnist', 'read_idx', 'read_split', 'cpu_devices',
           'gpu_devices', 'num_gpus', 'split_batch', 'try_all_gpus', 'try_gpu', 'CheckpointError',
           'DataError', 'DeviceError', 'GluonMultiGPUError', 'Interrupted', 'TrainingDiverged',
           'write_json', 'KVSTORES', 'MODELS', 'HybridResidual', 'Residual', 'count_flops',
           'default_initializer', 'get_model', 'hybrid_resnet18', 'resnet18', 'simple_cnn',
           'Animator', 'Progress', 'bar_chart', 'comparison_table', 'epoch_line', 'write_kvstore_report',
           'EpochRecord', 'Hook', 'TrainResult', 'evaluate_accuracy_gpus', 'train', 'train_batch',
           'train_epoch', 'Accumulator', 'Timer', 'accuracy']

"""gluon-multigpu: data-parallel training with MXNet Gluon, after d2l's
"Concise Implementation for Multiple GPUs".

The modules follow the section: ``devices`` (device lists, splitting a batch),
``model`` (ResNet-18, the simple CNN), ``data`` (Fashion-MNIST/MNIST),
``training`` (one step, one epoch, evaluation, ``train``), ``reporting``
(lines, tables, plots). Importing the package turns on MXNet's NumPy
semantics (``npx.set_np()``), as the book does.
"""
from mxnet import npx

npx.set_np()

# pylint: disable=wrong-import-position
from .errors import DataError, DeviceError, GluonMultiGPUError, TrainingDiverged
from .devices import cpu_devices, gpu_devices, num_gpus, split_batch, try_all_gpus, try_gpu
from .model import MODELS, Residual, default_initializer, get_model, resnet18, simple_cnn
from .data import (DATASETS, ArrayLoader, load_data, load_data_fashion_mnist, load_data_mnist,
                   read_idx, read_split)
from .utils import Accumulator, Timer, accuracy
from .training import (KVSTORES, EpochRecord, TrainResult, evaluate_accuracy_gpus, train,
                       train_batch, train_epoch)
from .reporting import Animator, comparison_table, epoch_line, write_json

__version__ = '0.1.0'

__all__ = ['GluonMultiGPUError', 'DeviceError', 'DataError', 'TrainingDiverged',
           'try_gpu', 'try_all_gpus', 'cpu_devices', 'gpu_devices', 'num_gpus', 'split_batch',
           'Residual', 'resnet18', 'simple_cnn', 'get_model', 'default_initializer', 'MODELS',
           'DATASETS', 'ArrayLoader', 'load_data', 'load_data_fashion_mnist', 'load_data_mnist',
           'read_idx', 'read_split',
           'Timer', 'Accumulator', 'accuracy',
           'KVSTORES', 'EpochRecord', 'TrainResult', 'evaluate_accuracy_gpus', 'train',
           'train_batch', 'train_epoch',
           'Animator', 'comparison_table', 'epoch_line', 'write_json']

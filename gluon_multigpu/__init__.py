"""gluon-multigpu: data-parallel training with MXNet Gluon, after d2l's
"Concise Implementation for Multiple GPUs".

The modules follow the section: ``devices`` (device lists, splitting a batch),
``model`` (ResNet-18, the simple CNN), ``data`` (Fashion-MNIST/MNIST),
``training`` (one step, one epoch, evaluation, ``train``), ``book`` (the
text's loop verbatim, for teaching and comparison), ``compare`` (runs that
differ in their kvstore), ``reporting`` (lines, tables, plots, reports),
``checkpoint`` (crash-safe checkpoints, stopping on a signal), ``runtime``
(engine settings), ``measure`` (timing one synchronisation, one step, a
sweep of runs) and ``scaling`` (bandwidth, speedup, the projection model and
their files).

The names below are loaded with their module on first use, and with it
MXNet, so that ``gluon_multigpu.runtime`` can still put the engine settings
for a given number of CPU contexts into the environment before MXNet is
imported (see ``runtime``). The first module that loads MXNet turns on its
NumPy semantics (``npx.set_np()``), as the book does.
"""
import importlib

from . import runtime

__version__ = '0.1.0'

_EXPORTS = {
    'errors': ['GluonMultiGPUError', 'DeviceError', 'DataError', 'TrainingDiverged',
               'CheckpointError', 'Interrupted'],
    'checkpoint': ['Checkpointer', 'StopRequest'],
    'devices': ['try_gpu', 'try_all_gpus', 'cpu_devices', 'gpu_devices', 'num_gpus',
                'split_batch'],
    'model': ['Residual', 'BookResidual', 'resnet18', 'book_resnet18', 'simple_cnn', 'get_model',
              'default_initializer', 'count_flops', 'MODELS'],
    'data': ['DATASETS', 'ArrayLoader', 'load_data', 'load_data_fashion_mnist', 'load_data_mnist',
             'read_idx', 'read_split'],
    'utils': ['Timer', 'Accumulator', 'accuracy'],
    'training': ['KVSTORES', 'EpochRecord', 'TrainResult', 'evaluate_accuracy_gpus', 'train',
                 'train_batch', 'train_epoch'],
    'book': ['train_book', 'evaluate_accuracy_book'],
    'reporting': ['Animator', 'comparison_table', 'epoch_line', 'write_json', 'bar_chart',
                  'write_kvstore_report'],
    'compare': ['ParamTracker', 'device_spread', 'recommend'],
    'measure': [],
    'scaling': [],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF) + ['runtime']


def __getattr__(name):
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f'.{_MODULE_OF[name]}', __name__), name)
    elif name in _EXPORTS:
        value = importlib.import_module(f'.{name}', __name__)
    else:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_EXPORTS))

"""gluon-multigpu: data-parallel training with MXNet Gluon, after d2l's
"Concise Implementation for Multiple GPUs" (section 13.6).

In a notebook or a script::

    import gluon_multigpu as gm
    devices = gm.cpu_devices(2)      # or gm.try_all_gpus(); configures MXNet's engine first
    train_iter, test_iter = gm.load_data_fashion_mnist(128, root='../shared/data/fashion-mnist')
    result = gm.train(gm.simple_cnn(), train_iter, test_iter, devices, num_epochs=2)
    print(result.final_line())       # test acc: 0.85, 17.5 sec/epoch on [cpu(0), cpu(1)]

The settings of a run and their meaning: ``help(gm.TrainConfig)`` (what ``train`` takes) and
``help(gm.RunConfig)`` (the command line's); each submodule by its short name (``gm.metrics``).
Without training here, ``import gluon_multigpu`` before ``import mxnet`` makes MXNet 1.9.1 work
on NumPy 2 and Python 3.12+ (``help(gm.compat)`` lists all it changes).
"""
import importlib as _importlib

from .base import compat as _compat

__version__ = '0.1.0'

# The first `import mxnet` of the process, from anywhere, finds NumPy and Python prepared
# (base.compat: MXNet 1.9.1 on NumPy 2, Python 3.12+).
_compat.install_hook()

#: The modules of each group (a subpackage), by their short names.
_GROUPED = {
    'filesafety': 'fs reading atomic paths foreign lockfile output files targets',
    'base': 'engine machine signals units protocol background compat opcache stacks values',
    'section': 'devices model recipes data kvstores steps results book utils',
    'observe': 'hooks interrupt live stall optional metrics profile traces stopping progress',
    'machinery': 'training pushers checks updates schedule config',
    'features': 'balance precision sync_bn distributed',
    'checkpoints': 'checkpoint manifest states savefolder checkpoint_store',
    'study': 'compare paired charts kvstore_report',
    'multihost': 'agent plan supervise allocation hung', 'runs': 'train_run kvstore_run comparison'}
#: The groups of modules, each a subpackage.
GROUPS = tuple(_GROUPED)
#: Where each module lives: short name -> group (or ``group.module`` where the name differs).
MODULES = {name: group for group, names in _GROUPED.items() for name in names.split()}

#: The package's names, by the short name of the module that defines them.
NAMES = {module: names.split() for module, names in {
    'book': 'evaluate_accuracy_book train_book', 'checkpoint': 'Checkpointer',
    'config': 'RunConfig TrainConfig', 'compare': 'ParamTracker device_spread recommend',
    'data': 'DATASETS ArrayLoader load_data load_data_fashion_mnist load_data_mnist read_idx '
            'read_split',
    'devices': 'cpu_devices gpu_devices num_gpus split_batch try_all_gpus try_gpu',
    'files': 'write_json', 'kvstores': 'KVSTORES',
    'model': 'MODELS HybridResidual Residual count_flops default_initializer get_model resnet18 '
             'simple_cnn',
    'recipes': 'Recipe RECIPES recipe_of', 'stopping': 'StallGuard StopRequest',
    'interrupt': 'Interruptible', 'progress': 'Progress', 'live': 'Live', 'metrics': 'Metrics',
    'profile': 'Profile', 'updates': 'Schedule', 'charts': 'Animator bar_chart',
    'kvstore_report': 'comparison_table write_kvstore_report',
    'results': 'EpochRecord TrainResult epoch_line',
    'training': 'Hook Step Training evaluate_accuracy_gpus last_run train train_batch train_epoch',
    'utils': 'Accumulator Timer accuracy',
    'errors': 'CheckpointError DataError DeviceError GluonMultiGPUError Interrupted MXNetLoadError '
              'SettingWarning TrainingDiverged'}.items()}
_WHERE = {name: module for module, names in NAMES.items() for name in names}

__all__ = [*GROUPS, 'errors', *MODULES, *_WHERE]


def _module(short):
    group, _, name = MODULES.get(short, '').partition('.')
    path = f'{group}.{name or short}' if group else short  # a group, or errors: itself
    return _importlib.import_module(f'{__name__}.{path}')


def __getattr__(name):
    """Load a group, a module, or the module that defines a name, when first used (PEP 562)."""
    if name in GROUPS or name in MODULES or name == 'errors':
        value = _module(name)
    elif name in _WHERE:
        value = getattr(_module(_WHERE[name]), name)
    else:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    globals()[name] = value
    return value


def __dir__():
    return sorted({*__all__, *(n for n in globals() if not n.startswith('_')), '__version__'})

"""The names the command line offers, importable without MXNet (scripts parse before it loads)."""

__all__ = ['KVSTORES', 'MODEL_NAMES', 'DATASET_NAMES', 'LR_RULES']

#: Gradient-synchronisation back ends accepted by ``train``: MXNet's kvstores
#: ``local`` (sum on the CPU), ``device`` (sum on the devices), ``nccl`` (NCCL
#: all-reduce between GPUs; needs a build with NCCL), and ``none`` (no kvstore:
#: the Trainer sums the gradients itself, the from-scratch way of d2l 13.5).
KVSTORES = ('local', 'device', 'nccl', 'none')
#: Networks of ``model.get_model``.
MODEL_NAMES = ('resnet18', 'simple-cnn')
#: Data sets of ``data.load_data``.
DATASET_NAMES = ('fashion-mnist', 'mnist')
#: Learning-rate rules of ``scripts/scaling.py`` (see ``scaling.learning_rate``).
LR_RULES = ('linear', 'fixed', 'sqrt')

"""The names the command line offers, importable without MXNet (scripts parse before it loads)."""

__all__ = ['KVSTORES', 'MODEL_NAMES', 'DATASET_NAMES']

#: Gradient-synchronisation back ends accepted by ``train``.
KVSTORES = ('local', 'device')
#: Networks of ``model.get_model``.
MODEL_NAMES = ('resnet18', 'simple-cnn')
#: Data sets of ``data.load_data``.
DATASET_NAMES = ('fashion-mnist', 'mnist')

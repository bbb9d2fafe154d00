"""A run's settings as one typed object: ``TrainConfig`` (what ``train`` takes) and
``RunConfig`` (a whole run of the command line: the network, the data, the outputs).

Each setting is a field with its type, default, one-line help, group and check,
here and nowhere else. A config is checked once, when it is made: a bad value
raises the package's one-line ``GluonMultiGPUError`` naming the setting in
backquotes (the command line spells it as its flag: ``flag``). The command
line is made from ``RunConfig``'s fields (``cli.train.build_parser``), a
checkpoint records ``RunConfig.recorded`` and a resumed run is compared with it
setting by setting, and ``--json`` writes ``as_dict``. Nothing here loads MXNet:
a config can be made before ``gm.cpu_devices`` sets MXNet's engine up.
"""
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Optional, Tuple, Union

from ..errors import GluonMultiGPUError
from ..base.values import (
    DATASET_NAMES, DATASETS, DIST_KVSTORES, DTYPES, KVSTORES, MAX_ACCUMULATE, MAX_CPU_DEVICES,
    MAX_GPUS, MAX_IN_FLIGHT, MAX_SEED, MODEL_NAMES, NO_DIST_CLIP, SCHEDULES, check_accumulate,
    check_clip, check_epochs, check_lr, check_seed, check_warmup, event_files,
    int_in, kvstores, non_negative_float, one_of, path, path_of, positive_float, seconds, split,
    split_weights, switch, whole)

__all__ = ['TrainConfig', 'RunConfig', 'GROUPS', 'PLAIN', 'setting']

#: The value of each setting a checkpoint records only where a run differs from it (a plain
#: run: one worker, float32, no sync_bn, the book's updates); what a resume names when absent.
PLAIN = {'workers': 1, 'dtype': 'float32', 'sync_bn': False, 'accumulate': 1,
         'clip_grad_norm': None, 'lr_schedule': 'constant', 'warmup_steps': 0}

#: The groups of settings, in the order ``--help`` shows them.
GROUPS = ('model and data', 'devices and kvstore', 'optimisation and schedule',
          'checkpoints and outputs', 'observability')


# -- fields ------------------------------------------------------------------------------------

def setting(default, group, help, check, parse=None, metavar=None, choices=None, nargs=None):
    """A field of a config: its ``default``, ``group`` (one of ``GROUPS``), one-line ``help``,
    ``check`` (value, name -> value, raising the one-line error) and how the command line
    reads it (``parse``, ``metavar``, ``choices``, ``nargs``)."""
    return field(default=default, metadata=dict(group=group, help=help, check=check, parse=parse,
                                                 metavar=metavar, choices=choices, nargs=nargs))


def _count(default, group, help, low, high, metavar='N'):
    """A ``setting`` of a whole number from ``low`` to ``high``, checked and read as one."""
    return setting(default, group, help, whole(low, high), int_in(low, high), metavar)


def _path(default, group, help, metavar, check=path):
    """A ``setting`` of a path: of a directory for ``metavar`` ``DIR``, else of a file."""
    return setting(default, group, help, check, path_of(_PATH_KINDS[metavar]), metavar)


_PATH_KINDS = {'DIR': 'a directory', 'PATH': 'a file name'}


_DATA, _DEV, _OPT, _OUT, _OBS = GROUPS


@dataclass
class TrainConfig:
    """The settings of ``train`` and ``Training`` (``gm.train(..., lr=0.1)`` sets ``lr``).

    Parameters
    ----------
    num_epochs : int
        Passes over the training data ``train`` makes (default 10).
    lr : float or None
        SGD learning rate; None: the network's recipe (``recipes``) for the batch.
    kvstore : str or KVStore
        How gradients are summed: ``local`` (on the CPU), ``device`` (on the
        devices), ``nccl``, ``none`` (the Trainer itself), a ``dist_*`` kvstore
        of a parameter server, or a kvstore object.
    seed : int or None
        Seed of the initial weights (0 to 2**32-1); None: not seeded.
    max_in_flight : int or None
        Steps MXNet may run behind Python (0: no bound); None: the recipe's.
    accumulate : int
        Batches whose gradients are summed into one update (1 to 10**4).
    clip_grad_norm : float or None
        Largest global gradient norm (per sample) of an update; None: no clipping.
    lr_schedule : str
        Rate of each update: ``constant``, ``step``, ``cosine`` or ``onecycle``.
    warmup_steps : int
        Updates whose rate rises linearly to ``lr`` before the schedule.
    tensorboard : str or None
        Folder of TensorBoard event files (needs tensorboardX); None: none.
    metrics : str or None
        File of JSON lines with the same figures; None: none.
    log_every : int
        Steps between two step figures of ``tensorboard`` and ``metrics``.
    progress_interval : float
        Seconds between progress lines on stderr (0: no progress shown). ``train`` shows
        them where a person watches, stderr a terminal (in a Jupyter notebook a display
        updated in place instead; piped or redirected: nothing).
    profile : str, tuple or None
        Steps to profile with MXNet's profiler, ``'START:STOP'`` (from 1 across
        epochs) or ``(start, stop)`` or ``(start, stop, file)``; None: none.
    stall_timeout : float or None
        Seconds without a queued step after which the run ends as stuck; None
        or 0: not watched.
    """

    num_epochs: int = setting(10, _OPT, 'passes over the training set',
                              check_epochs, int_in(1, 10**5), 'N')
    lr: Optional[float] = setting(None, _OPT, 'SGD learning rate (default: per model, below)',
                                  lambda v, n: None if v is None else check_lr(v),
                                  positive_float, 'LR')
    kvstore: object = 'device'
    seed: Optional[int] = setting(0, _DATA, 'seed of the initial weights and the data order',
                                  check_seed, int_in(0, MAX_SEED), 'N')
    max_in_flight: Optional[int] = None
    accumulate: int = setting(1, _OPT, 'sum the gradients of K batches into one update',
                              check_accumulate, int_in(1, MAX_ACCUMULATE), 'K')
    clip_grad_norm: Optional[float] = setting(
        None, _OPT, "clip each update's global gradient norm (per sample) at X",
        check_clip, positive_float, 'X')
    lr_schedule: str = setting('constant', _OPT, 'learning rate of each update',
                               one_of(SCHEDULES), choices=SCHEDULES)
    warmup_steps: int = setting(0, _OPT, 'updates whose rate rises linearly to `lr` first',
                                check_warmup, int_in(0, 10**8), 'N')
    tensorboard: Optional[str] = _path(None, _OBS, 'TensorBoard event files in DIR (needs '
                                       'tensorboardX)', 'DIR', event_files)
    metrics: Optional[str] = _path(None, _OBS, 'the same figures as JSON lines in PATH', 'PATH')
    log_every: int = _count(50, _OBS, 'steps between two step figures of the two above', 1, 10**6)
    progress_interval: float = setting(10.0, _OBS, 'seconds between progress lines on stderr '
                                       '(0: none)', seconds, non_negative_float, 'SECONDS')
    profile: object = None
    stall_timeout: Optional[float] = None

    def __post_init__(self):
        for f in fields(self):
            if (check := f.metadata.get('check')) is not None:
                setattr(self, f.name, check(getattr(self, f.name), f.name))

    @classmethod
    def of(cls, config=None, **settings):
        """``config`` (a config, or None: the defaults) with ``settings`` changed, checked.

        A name that is not a setting raises ``GluonMultiGPUError`` naming it.
        """
        names = {f.name for f in fields(cls)}
        if unknown := sorted(set(settings) - names):
            raise GluonMultiGPUError(f'{", ".join(unknown)}: not a setting of {cls.__name__}; '
                                     f'give some of {", ".join(sorted(names))}')
        return cls(**settings) if config is None else dataclasses.replace(config, **settings)

    def as_dict(self):
        """Every setting by name, as ``--json`` writes it (tuples as lists)."""
        return {f.name: list(v) if isinstance(v, tuple) else v
                for f in fields(self) for v in [getattr(self, f.name)]}


@dataclass
class RunConfig(TrainConfig):
    """A whole run as the command line (``scripts/train.py``) describes it: ``TrainConfig``'s
    settings, the network and data set by name, the devices, the outputs.

    ``RunConfig(model='simple-cnn', cpu_devices=2)`` checks every value and
    every pair that cannot go together, and raises ``GluonMultiGPUError``
    naming the settings; what depends on the machine (the devices that exist,
    the memory, the files) is checked when the run starts. Each field's help is
    its line in the train program's ``--help``, which lists them by group.

    Parameters
    ----------
    model, dataset : str
        The network (``resnet18``, ``simple-cnn``) and data set (``fashion-mnist``, ``mnist``).
    data_dir : str or None
        Folder of the four IDX ``.gz`` files; None: ``~/.mxnet/datasets/<dataset>``.
    download : bool
        Download missing files from MXNet's mirror.
    num_train, num_test : int or None
        Train and test on the first N images only; None: all.
    synthetic : bool
        Random images and labels of the data set's shape, for speed tests.
    num_gpus, cpu_devices : int or None
        Train on N GPUs, or on N CPU contexts (at most one of the two).
    kvstore : tuple of str
        The kvstores; several train in turn on the same data and are compared.
    split : None, 'auto' or list of float
        How each batch is shared among the devices: evenly, measured, or by weights.
    sync_bn : bool
        ResNet-18 with BatchNorm statistics over all devices' shards.
    dtype : str
        Compute type: ``float32``, ``float16`` (GPUs), ``bfloat16``.
    book_literal : bool
        Run the text's own loop instead of the package's.
    batch_size : int or None
        Total batch over all devices; None: the recipe's per device.
    checkpoint_dir, resume : str or None, bool
        Save after every epoch into this folder; continue from it.
    json, plot, report : str or None
        Every figure as JSON; the accuracy curve as a chart; the kvstores' report folder.
    profile, profile_file : str or None
        Steps ``START:STOP`` to profile, and the trace's file (``profile.json``).
    Other fields: ``TrainConfig``.
    """

    model: str = setting('resnet18', _DATA, 'network', one_of(MODEL_NAMES), choices=MODEL_NAMES)
    dataset: str = setting('fashion-mnist', _DATA, 'data set', one_of(DATASET_NAMES),
                           choices=DATASET_NAMES)
    data_dir: Optional[str] = _path(None, _DATA, 'folder of the four IDX .gz files (default: '
                                    '~/.mxnet/datasets/<dataset>)', 'DIR')
    download: bool = setting(False, _DATA, "download missing files from MXNet's mirror "
                             '(needs internet)', switch)
    num_train: Optional[int] = _count(None, _DATA, 'train on the first N images only '
                                      '(default: all)', 1, 10**8)
    num_test: Optional[int] = _count(None, _DATA, 'test on the first N images only '
                                     '(default: all)', 1, 10**8)
    synthetic: bool = setting(False, _DATA, "random data of the data set's shape, for speed "
                              'tests', switch)
    num_gpus: Optional[int] = _count(None, _DEV, 'train on gpu(0)..gpu(N-1) (default: all '
                                     'GPUs, or the CPU if none)', 1, MAX_GPUS)
    cpu_devices: Optional[int] = _count(None, _DEV, 'train on N CPU contexts cpu(0)..cpu(N-1)',
                                        1, MAX_CPU_DEVICES)
    kvstore: Tuple[str, ...] = setting(
        ('device',), _DEV, 'gradient sum: local, device, nccl, none, or dist_* under the '
        'launcher; several are compared in turn', kvstores, metavar='KV',
        choices=KVSTORES + DIST_KVSTORES, nargs='+')
    split: Union[None, str, list] = setting(
        None, _DEV, "each batch's shares: even, auto (measured) or weights W1,W2,...", split,
        split_weights, 'even|auto|W1,W2,...')
    sync_bn: bool = setting(False, _DEV, "ResNet-18's BatchNorm statistics over all devices",
                            switch)
    dtype: str = setting('float32', _DEV, 'compute type (float16: GPUs; bfloat16: CPUs with '
                         'AVX512-BF16)', one_of(DTYPES), choices=DTYPES)
    book_literal: bool = setting(False, _DEV, "run the text's own loop (nn.Block residuals, no "
                                 'hybridization)', switch)
    max_in_flight: int = _count(MAX_IN_FLIGHT, _DEV, 'steps MXNet may run behind Python '
                                "(0: no bound, the book's loop)", 0, 1000, 'K')
    batch_size: Optional[int] = _count(None, _OPT, 'total batch size over all devices '
                                       '(default: per model, below)', 1, 10**6)
    checkpoint_dir: Optional[str] = _path(None, _OUT, 'save the run after every epoch and on a '
                                          'stop into DIR', 'DIR')
    resume: bool = setting(False, _OUT, 'continue from the checkpoint in `checkpoint_dir`', switch)
    json: Optional[str] = _path(None, _OUT, 'every figure of the run(s) as JSON', 'PATH')
    plot: Optional[str] = _path(None, _OUT, 'the test-accuracy curve, PNG, SVG or PDF by the '
                                'extension', 'PATH')
    report: Optional[str] = _path(None, _OUT, "a Markdown report of the kvstores' comparison "
                                  'into DIR', 'DIR')
    stall_timeout: float = setting(0.0, _OBS, 'end a run that queues no step for this long, '
                                   'exit status 3 (0: not watched)', seconds,
                                   non_negative_float, 'SECONDS')
    profile: Optional[str] = setting(None, _OBS, "profile steps START to STOP (from 1 across "
                                     "epochs) with MXNet's profiler", path, metavar='START:STOP')
    profile_file: Optional[str] = _path(None, _OBS, "where `profile` writes its Chrome trace "
                                        '(default: profile.json)', 'PATH')

    def __post_init__(self):
        super().__post_init__()
        for problem in self._together():
            raise GluonMultiGPUError(problem)

    def _together(self):
        """What cannot go together, whatever the machine: each a one-line message."""
        several, dist = len(self.kvstore) > 1, [k for k in self.kvstore if k in DIST_KVSTORES]
        book = self.book_literal
        if self.num_gpus is not None and self.cpu_devices is not None:
            yield '`num_gpus` and `cpu_devices` choose the devices; give one of them'
        if self.split is not None and book:
            yield "`book_literal` runs the text's even split; drop `split`"
        if self.dtype != 'float32' and book:
            yield "`book_literal` runs the text's float32 loop; drop `dtype`"
        if self.stall_timeout and book:
            yield ("`stall_timeout` watches the steps of the section's loop, and `book_literal` "
                   "runs the text's loop, which no hook follows; drop one of them")
        if self.stall_timeout and not self.max_in_flight:
            yield ('`stall_timeout` watches the time between steps, and with `max_in_flight` 0 a '
                   'whole epoch is queued at once and waited for at its end; give '
                   '`max_in_flight` 1 or more')
        if book and self.updates():
            yield ("`book_literal` runs the text's update after every batch at one rate; drop "
                   '`accumulate`, `clip_grad_norm`, `lr_schedule` and `warmup_steps`, or '
                   '`book_literal`')
        if self.clip_grad_norm is not None and dist:
            yield NO_DIST_CLIP
        if (self.tensorboard or self.metrics) and several:
            yield '`tensorboard` and `metrics` follow one run; give a single `kvstore`'
        if (self.tensorboard or self.metrics) and book:
            yield ("`book_literal` runs the text's loop, which no hook follows; drop "
                   '`tensorboard` and `metrics` or `book_literal`')
        if self.profile_file is not None and self.profile is None:
            yield '`profile_file` needs `profile` START:STOP, the steps to profile'
        if self.profile is not None and (several or book):
            yield ("`profile` follows one run of the section's loop: give one `kvstore`, "
                   'without `book_literal`')

    def updates(self):
        """What the run's updates do other than the book's (None: nothing), as its checkpoint
        records them: a schedule's length in epochs included."""
        keys = ('accumulate', 'clip_grad_norm', 'lr_schedule', 'warmup_steps')
        changed = {key: getattr(self, key) for key in keys if getattr(self, key) != PLAIN[key]}
        if self.lr_schedule != 'constant':
            changed['schedule_epochs'] = self.num_epochs  # its rates follow the run's length
        return changed or None

    def recorded(self, batch_size, lr, workers=1):
        """What a checkpoint records of the run, and a resumed run must match: the settings
        that decide its numbers, with the ``batch_size`` and ``lr`` the run resolved and
        its parameter server's ``workers``. Those of a plain run (one worker, float32, no
        sync_bn, the book's updates) are left out, as checkpoints have always had them."""
        record = {'model': self.model, 'dataset': self.dataset, 'batch_size': batch_size, 'lr': lr,
                  'seed': self.seed, 'num_train': self.num_train or DATASETS[self.dataset]['train'],
                  'num_test': self.num_test or DATASETS[self.dataset]['test'],
                  'book_literal': self.book_literal}
        optional = {'workers': workers, 'dtype': self.dtype, 'sync_bn': self.sync_bn,
                    'updates': self.updates()}
        return {**record, **{k: v for k, v in optional.items() if v != PLAIN.get(k)}}

    def training(self, kvstore, lr):
        """The ``TrainConfig`` of this run's training with ``kvstore`` at rate ``lr``."""
        # (the command line makes the hooks of the observability settings itself)
        names = {f.name for f in fields(TrainConfig)} - {'kvstore', 'lr', 'profile', 'metrics',
                                                          'stall_timeout', 'tensorboard'}
        return TrainConfig(**{name: getattr(self, name) for name in names}, kvstore=kvstore, lr=lr)

    @property
    def profile_path(self):
        """Where ``profile`` writes its trace (None without ``profile``)."""
        return None if self.profile is None else (self.profile_file or 'profile.json')

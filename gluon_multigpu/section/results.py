"""What training returns: the figures of an epoch, of part of one, and of a whole run."""
from dataclasses import asdict, dataclass, field
from typing import List, NamedTuple, Optional

__all__ = ['EpochRecord', 'TrainResult', 'EpochTotals', 'OPTIONAL_FIELDS']

#: The fields of an ``EpochRecord`` that only some runs have (None where not).
OPTIONAL_FIELDS = ('rates', 'grad_norms')


@dataclass
class EpochRecord:
    """Figures of one epoch; ``seconds`` is the training time only, as in the book.

    ``train_loss`` and ``train_acc`` are None for the text's loop, which computes neither;
    ``test_acc`` is None where there was no evaluation (a parameter server's other workers).
    """
    epoch: int
    train_loss: Optional[float]
    train_acc: Optional[float]
    test_acc: Optional[float]
    seconds: float
    eval_seconds: float
    samples: int
    #: With an accumulated, clipped or scheduled update (``updates``): the rate of each update,
    #: and the global gradient norm before clipping of each (a resumed epoch's from its checkpoint).
    rates: Optional[List[float]] = None
    grad_norms: Optional[List[float]] = None

    def to_dict(self):
        """The figures as plain data, without the optional ones a run did not make."""
        return {k: v for k, v in vars(self).items() if v is not None or k not in OPTIONAL_FIELDS}

    @property
    def samples_per_sec(self):
        """Training samples per second of the epoch."""
        return self.samples / self.seconds


@dataclass
class TrainResult:
    """What ``train`` returns: the per-epoch history and how it was run."""
    devices: List[str]
    kvstore: Optional[str]
    lr: float
    epochs: List[EpochRecord] = field(default_factory=list)
    workers: int = 1  # processes of a parameter-server run, each on ``devices``

    @property
    def test_acc(self):
        """Test accuracy after each epoch."""
        return [e.test_acc for e in self.epochs]

    @property
    def sec_per_epoch(self):
        """Mean training seconds per epoch (the book's ``timer.avg()``)."""
        return sum(e.seconds for e in self.epochs) / len(self.epochs)

    @property
    def samples_per_sec(self):
        """Training samples per second over all epochs."""
        return sum(e.samples for e in self.epochs) / sum(e.seconds for e in self.epochs)

    def final_line(self):
        """Return the book's closing line, e.g. ``test acc: 0.92, 13.4 sec/epoch on [gpu(0)]``."""
        workers = f'{self.workers} workers x ' if self.workers > 1 else ''
        where = f'on {workers}[{", ".join(self.devices)}]'
        if not self.epochs:
            return f'no epoch trained {where}'
        # the last None: no test set (the workers of a parameter server)
        accuracy = 'no test set' if (acc := self.test_acc[-1]) is None else f'test acc: {acc:.2f}'
        return f'{accuracy}, {self.sec_per_epoch:.1f} sec/epoch {where}'

    def to_dict(self):
        """Return every figure as plain JSON-ready data."""
        return {**asdict(self), 'epochs': [e.to_dict() for e in self.epochs],
                'sec_per_epoch': self.sec_per_epoch, 'samples_per_sec': self.samples_per_sec}


class EpochTotals(NamedTuple):
    """What one epoch (or the part of it run so far) adds up to."""
    loss_sum: float
    num_correct: float
    samples: int
    seconds: float
    batches: int
    stopped: bool = False  # ended early on request, not at the end of the data
    grad_norms: tuple = ()  # with an ``Update`` that measures them: each update's norm so far

    def __add__(self, other):
        """Totals of this part of an epoch followed by ``other``."""
        return EpochTotals(*(a + b for a, b in zip(self[:5], other[:5])), other.stopped,
                           (*self.grad_norms, *other.grad_norms))

    def to_dict(self):
        """The totals as plain data (``grad_norms`` only where there are some)."""
        return {k: list(v) if k == 'grad_norms' else v for k, v in self._asdict().items()
                if k != 'grad_norms' or v}


def epoch_line(record, num_epochs):
    """Return the line of one epoch (an ``EpochRecord``); the text's loop has no training figures."""
    train = ('' if record.train_loss is None else
             f'loss {record.train_loss:.4f}, train acc {record.train_acc:.3f}, ')
    test = '' if record.test_acc is None else f'test acc {record.test_acc:.3f}, '
    return (f'epoch {record.epoch}/{num_epochs}: {train}{test}{record.seconds:.1f} s, '
            f'{record.samples_per_sec:.0f} samples/s')

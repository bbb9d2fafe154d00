"""Small helpers of the book: a timer, an accumulator and the accuracy count."""
import itertools
import time

__all__ = ['Timer', 'Accumulator', 'accuracy']


class Timer:
    """Record several wall-clock intervals, in seconds."""

    def __init__(self):
        self.times = []
        self.start()

    def start(self):
        """Start the timer."""
        self._tik = time.perf_counter()

    def stop(self):
        """Stop the timer, record the interval and return it (seconds)."""
        self.times.append(time.perf_counter() - self._tik)
        return self.times[-1]

    def elapsed(self):
        """Return the seconds since the last ``start`` without recording them."""
        return time.perf_counter() - self._tik

    def avg(self):
        """Return the average recorded interval (seconds)."""
        return sum(self.times) / len(self.times)

    def sum(self):
        """Return the sum of the recorded intervals (seconds)."""
        return sum(self.times)

    def cumsum(self):
        """Return the running totals of the recorded intervals (seconds)."""
        return list(itertools.accumulate(self.times))


class Accumulator:
    """Sum ``n`` quantities over many ``add`` calls."""

    def __init__(self, n):
        self.data = [0.0] * n

    def add(self, *args):
        """Add one value to each of the ``n`` sums."""
        self.data = [a + float(b) for a, b in zip(self.data, args)]

    def reset(self):
        """Set all sums to zero."""
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]


def accuracy(y_hat, y):
    """Return the number of correct predictions as a 0-d array on ``y_hat``'s device.

    No host synchronisation happens here; ``float()`` the result for a number
    (that is a sync point).
    """
    if len(y_hat.shape) > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(axis=1)
    return (y_hat.astype(y.dtype) == y).astype('float32').sum()

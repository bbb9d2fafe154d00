"""Reporting: the per-epoch line, the side-by-side table, an Animator that writes PNGs, JSON."""
import json
import os
import tempfile

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ['Animator', 'epoch_line', 'comparison_table', 'atomic_write', 'write_json']


class Animator:
    """Collect points of one or more lines and draw them into a PNG (no notebook needed).

    Mirrors the book's ``d2l.Animator``: ``add(x, y)`` appends one point per
    line, and ``X``/``Y`` hold the data (``animator.Y[0][-1]`` is the last
    value of the first line). ``save(path)`` draws the figure and writes it.

    Parameters
    ----------
    xlabel, ylabel : str, optional
    legend : list of str, optional
        One name per line.
    xlim, ylim : (float, float), optional
    title : str, optional
    figsize : (float, float)
        Inches.
    """

    def __init__(self, xlabel=None, ylabel=None, legend=None, xlim=None, ylim=None,
                 title=None, figsize=(5, 3.5)):
        self.xlabel, self.ylabel, self.legend = xlabel, ylabel, list(legend or [])
        self.xlim, self.ylim, self.title, self.figsize = xlim, ylim, title, figsize
        self.X, self.Y = None, None

    def add(self, x, y):
        """Append the point ``(x, y_i)`` to every line ``i``; ``y`` is a number or a sequence."""
        if not hasattr(y, '__len__'):
            y = [y]
        if not hasattr(x, '__len__'):
            x = [x] * len(y)
        if self.X is None:
            self.X, self.Y = [[] for _ in y], [[] for _ in y]
        for i, (a, b) in enumerate(zip(x, y)):
            if a is not None and b is not None:
                self.X[i].append(a)
                self.Y[i].append(b)

    def figure(self):
        """Return a new matplotlib ``Figure`` with the lines drawn so far."""
        fig = Figure(figsize=self.figsize)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for i, (xs, ys) in enumerate(zip(self.X or [], self.Y or [])):
            label = self.legend[i] if i < len(self.legend) else None
            ax.plot(xs, ys, marker='o', label=label)
        if all(isinstance(x, int) for xs in self.X or [] for x in xs):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs, not fractions
        ax.set_xlabel(self.xlabel or '')
        ax.set_ylabel(self.ylabel or '')
        if self.xlim:
            ax.set_xlim(*self.xlim)
        if self.ylim:
            ax.set_ylim(*self.ylim)
        if self.title:
            ax.set_title(self.title)
        if self.legend:
            ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        return fig

    def save(self, path):
        """Write the figure as a PNG to ``path``, atomically."""
        fig = self.figure()
        with atomic_write(path, 'wb') as f:
            fig.savefig(f, format='png', dpi=100)


def epoch_line(record, num_epochs):
    """Return the progress line of one epoch (an ``EpochRecord``)."""
    return (f'epoch {record.epoch}/{num_epochs}: loss {record.train_loss:.4f}, '
            f'train acc {record.train_acc:.3f}, test acc {record.test_acc:.3f}, '
            f'{record.seconds:.1f} s, {record.samples_per_sec:.0f} samples/s')


def comparison_table(results):
    """Return a Markdown table comparing several ``TrainResult`` objects side by side."""
    rows = ['| kvstore | devices | sec/epoch | samples/s | final test acc |',
            '| --- | --- | ---: | ---: | ---: |']
    for r in results:
        rows.append(f'| {r.kvstore} | {", ".join(r.devices)} | {r.sec_per_epoch:.2f} | '
                    f'{r.samples_per_sec:.0f} | {r.test_acc[-1]:.4f} |')
    return '\n'.join(rows)


class atomic_write:  # pylint: disable=invalid-name
    """Context manager writing ``path`` through a temporary file in the same directory.

    The file appears under its name only when the block ends without error
    (flushed, fsynced, renamed); otherwise nothing is left behind.
    """

    def __init__(self, path, mode='w'):
        self.path, self.mode = os.path.abspath(path), mode
        self._tmp, self._file = None, None

    def __enter__(self):
        fd, self._tmp = tempfile.mkstemp(dir=os.path.dirname(self.path),
                                         prefix=f'.{os.path.basename(self.path)}.', suffix='.tmp')
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        self._file = os.fdopen(fd, self.mode)
        return self._file

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
            if exc_type is None:
                os.replace(self._tmp, self.path)
        finally:
            if os.path.exists(self._tmp):
                os.remove(self._tmp)
        return False


def write_json(path, obj):
    """Write ``obj`` as indented JSON to ``path``, atomically."""
    with atomic_write(path, 'w') as f:
        json.dump(obj, f, indent=2)
        f.write('\n')

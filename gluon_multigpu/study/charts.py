"""Charts: an Animator that draws lines into a file, bar charts, the accuracy chart.

Charts are PNG, SVG or PDF, as the name's extension says (``check_chart_path``),
written atomically; matplotlib loads only when this module does.
"""
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..errors import GluonMultiGPUError
from ..filesafety.output import atomic_write, naming

__all__ = ['Animator', 'bar_chart', 'accuracy_chart', 'seconds_chart', 'CHART_FORMATS',
           'check_chart_path', 'save_figure']

#: Chart formats by file extension: what matplotlib's Agg canvas writes without other backends.
CHART_FORMATS = {'.png': 'png', '.svg': 'svg', '.pdf': 'pdf'}


def check_chart_path(path, what):
    """Return the format of a chart written to ``path``; raise unless its extension names one.

    The extension decides (case aside): ``.png``, ``.svg`` or ``.pdf``. Any
    other raises ``GluonMultiGPUError`` naming ``what`` (the option, for the
    message): a chart named ``x.svg`` must not hold PNG bytes. Only the name
    is checked: ``targets.check_output_path`` checks that it can be written.
    """
    extension = os.path.splitext(os.fspath(path))[1]
    if extension.lower() not in CHART_FORMATS:
        given = f'has the extension {extension}' if extension else 'has no extension'
        raise GluonMultiGPUError(f'{what} {path} {given}; a chart is written as '
                                 f'{", ".join(CHART_FORMATS)} (from the extension): give a name '
                                 'ending in one of them')
    return CHART_FORMATS[extension.lower()]


def _axes(figsize):
    """A new ``Figure`` of ``figsize`` (drawn by Agg) and its one ``Axes``."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _finish(fig, ax, grid='both', **given):
    """Set what is ``given`` of ``ax`` (labels, limits, title; None or empty: matplotlib's), draw
    its grid (along ``grid``) and lay ``fig`` out; return ``fig``."""
    ax.set(**{name: value for name, value in given.items() if value})
    ax.grid(True, axis=grid, alpha=0.3)
    fig.tight_layout()
    return fig


def save_figure(fig, path):
    """Write ``fig`` to ``path`` atomically, in the format its extension names (PNG, SVG, PDF)."""
    chart_format = check_chart_path(path, 'chart')
    with naming(path), atomic_write(path, 'wb') as f:
        fig.savefig(f, format=chart_format, dpi=100)


class Animator:
    """Collect points of one or more lines and draw them into a chart file (no notebook needed).

    Mirrors the book's ``d2l.Animator``: ``add(x, y)`` appends one point per
    line, and ``X``/``Y`` hold the data (``animator.Y[0][-1]`` is the last
    value of the first line). ``save(path)`` draws the figure and writes it.

    Parameters
    ----------
    xlabel, ylabel : str, optional
        The axes' labels.
    legend : list of str, optional
        One name per line.
    xlim, ylim : (float, float), optional
        The axes' ranges (None: matplotlib's).
    title : str, optional
        The chart's title.
    figsize : (float, float)
        Width and height, in inches.
    """

    def __init__(self, xlabel=None, ylabel=None, legend=None, xlim=None, ylim=None,
                 title=None, figsize=(5, 3.5)):
        self.xlabel, self.ylabel, self.legend = xlabel, ylabel, list(legend or [])
        self.xlim, self.ylim, self.title, self.figsize = xlim, ylim, title, figsize
        self.X, self.Y = None, None

    def add(self, x, y):
        """Append the point ``(x, y_i)`` to every line ``i``; ``y`` is a number or a sequence."""
        y = y if hasattr(y, '__len__') else [y]
        x = x if hasattr(x, '__len__') else [x] * len(y)
        if self.X is None:
            self.X, self.Y = [[] for _ in y], [[] for _ in y]
        for i, (a, b) in enumerate(zip(x, y)):
            if a is not None and b is not None:
                self.X[i].append(a)
                self.Y[i].append(b)

    def figure(self):
        """Return a new matplotlib ``Figure`` with the lines drawn so far."""
        fig, ax = _axes(self.figsize)
        for i, (xs, ys) in enumerate(zip(self.X or [], self.Y or [])):
            label = self.legend[i] if i < len(self.legend) else None
            # Lines that coincide (kvstores that agree) stay visible: styles differ.
            ax.plot(xs, ys, marker='osD^v'[i % 5], linestyle=['-', '--', ':', '-.'][i % 4],
                    markersize=10 - 2 * (i % 3), fillstyle='none', label=label)
        values = sorted({x for xs in self.X or [] for x in xs})
        if values and all(isinstance(x, int) for x in values):  # epochs, not fractions
            if len(values) <= 20:
                ax.set_xticks(values)
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if self.legend:
            ax.legend()
        return _finish(fig, ax, xlabel=self.xlabel, ylabel=self.ylabel, xlim=self.xlim,
                       ylim=self.ylim, title=self.title)

    def save(self, path):
        """Write the figure to ``path``, atomically, as PNG, SVG or PDF by its extension."""
        save_figure(self.figure(), path)


def bar_chart(path, labels, values, ylabel, title=None, figsize=(5, 3.5), fmt='%.2f'):
    """Write a bar chart of ``values`` (one bar per label, value printed on it as ``fmt``).

    PNG, SVG or PDF, as the extension of ``path`` says.
    """
    fig, ax = _axes(figsize)
    bars = ax.bar(labels, values, color='tab:blue')
    ax.margins(y=0.12)  # room for the value labels
    ax.bar_label(bars, fmt=fmt)
    save_figure(_finish(fig, ax, 'y', ylabel=ylabel, title=title), path)


def _epochs_chart(path, results, ylabel, values, title, xlabel='epoch'):
    """Write one line per ``TrainResult``: ``values(result)``, one point per epoch."""
    num_epochs = max(len(r.epochs) for r in results)
    animator = Animator(xlabel=xlabel, ylabel=ylabel, xlim=[0.5, num_epochs + 0.5], title=title,
                        legend=[f'kvstore {r.kvstore}' for r in results])
    for i in range(num_epochs):
        animator.add(i + 1, [values(r)[i] if i < len(r.epochs) else None for r in results])
    animator.save(path)


def accuracy_chart(path, results, title=None):
    """Write the test accuracy per epoch of several ``TrainResult`` objects on one chart.

    PNG, SVG or PDF, as the extension of ``path`` says; an ``OSError`` names ``path``.
    """
    _epochs_chart(path, results, 'test acc', lambda r: r.test_acc, title)


def seconds_chart(path, results, title=None):
    """Write every epoch's training seconds of several ``TrainResult`` objects on one chart.

    The epochs of a comparison are its rounds, so the chart shows every round
    the paired ratios are made of (round 1 warms the process and is not
    judged). PNG, SVG or PDF, as the extension of ``path`` says.
    """
    _epochs_chart(path, results, 'training seconds', lambda r: [e.seconds for e in r.epochs],
                  title, xlabel='round (epoch; round 1, the warm-up, is not judged)')

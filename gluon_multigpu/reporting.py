"""Reporting: the per-epoch line, the side-by-side table, an Animator that draws charts, reports.

Charts are PNG, SVG or PDF, as the name's extension says (``check_chart_path``).
A report folder is written all or nothing (``ReportFolder``): a disk that fills
or an interruption half-way leaves the folder as it was, and the ``OSError``
names the report file it was writing.
"""
import os
import shutil
import tempfile

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mxnet import npx

from .errors import GluonMultiGPUError
from .files import atomic_write, write_json
from .training import Hook

__all__ = ['Animator', 'Progress', 'duration', 'markdown_table', 'epoch_line', 'comparison_table',
           'bar_chart', 'accuracy_chart', 'write_kvstore_report', 'CHART_FORMATS',
           'check_chart_path', 'save_figure', 'ReportFolder', 'naming']

#: Chart formats by file extension: what matplotlib's Agg canvas writes without other backends.
CHART_FORMATS = {'.png': 'png', '.svg': 'svg', '.pdf': 'pdf'}


def check_chart_path(path, what):
    """Return the format of a chart written to ``path``; raise unless its extension names one.

    The extension decides (case aside): ``.png``, ``.svg`` or ``.pdf``. Any
    other raises ``GluonMultiGPUError`` naming ``what`` (the option, for the
    message): a chart named ``x.svg`` must not hold PNG bytes. Only the name
    is checked: ``files.check_output_path`` checks that it can be written.
    """
    extension = os.path.splitext(os.fspath(path))[1]
    if extension.lower() not in CHART_FORMATS:
        given = f'has the extension {extension}' if extension else 'has no extension'
        raise GluonMultiGPUError(f'{what} {path} {given}; a chart is written as '
                                 f'{", ".join(CHART_FORMATS)} (from the extension): give a name '
                                 'ending in one of them')
    return CHART_FORMATS[extension.lower()]


def _naming(error, path):
    """``error`` (an ``OSError``) naming ``path`` as its file: itself, or a new one of its kind.

    A rename's error names two files, and the second cannot be unset: such an
    error is replaced (``OSError`` picks the subclass its errno stands for).
    """
    if error.filename2 is None:
        error.filename = path
        return error
    return OSError(error.errno, error.strerror, path)


class naming:  # pylint: disable=invalid-name
    """Context manager: an ``OSError`` inside names ``path`` (``filename``), the file written.

    A write that fails on a full disk raises ``OSError`` without a file name,
    and one through a temporary file names the temporary; the user knows the
    file by the name they asked for.
    """

    def __init__(self, path):
        self.path = os.fspath(path)

    def __enter__(self):
        return self.path

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, OSError):
            named = _naming(exc, self.path)
            if named is not exc:
                raise named from exc
        return False


def save_figure(fig, path):
    """Write ``fig`` to ``path`` atomically, in the format its extension names (PNG, SVG, PDF)."""
    chart_format = check_chart_path(path, 'chart')
    with naming(path), atomic_write(path, 'wb') as f:
        fig.savefig(f, format=chart_format, dpi=100)


class ReportFolder:
    """Write the files of a report into ``directory`` all or nothing: a context manager.

    ``path(name)`` gives where to write the report's file ``name``: a hidden
    staging folder inside ``directory``, so that any function writing to a
    path will do. When the block ends without error, every staged file is
    moved to its name. When it fails (a disk that fills, an interruption),
    the staged files are removed, and ``directory`` too if this call created
    it: the folder is left as it was. Should a move fail, the files moved
    before it are removed as well: nothing this call wrote stays. An
    ``OSError`` names the report file being written (``filename``), not its
    staging name.
    """

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        self._staging, self._made, self._moved, self._names = None, [], [], []
        self._current = None  # the report file being written or moved

    def __enter__(self):
        missing, probe = [], os.path.abspath(self.directory)
        while not os.path.lexists(probe):
            missing.append(probe)  # innermost first: the order to remove them in
            probe = os.path.dirname(probe)
        self._made = missing
        try:
            with naming(self.directory):
                os.makedirs(self.directory, exist_ok=True)
                self._staging = tempfile.mkdtemp(dir=self.directory, prefix='.report-',
                                                 suffix='.tmp')
        except BaseException:
            self._remove_made()
            raise
        return self

    def path(self, name):
        """Where to write the report's file ``name`` (staged until the block ends)."""
        self._current = os.path.join(self.directory, name)
        self._names.append(name)
        return os.path.join(self._staging, name)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                for name in dict.fromkeys(self._names):
                    self._current = os.path.join(self.directory, name)
                    os.replace(os.path.join(self._staging, name), self._current)
                    self._moved.append(self._current)
            except BaseException as e:
                self._undo()
                named = self._named(e)
                if named is e:
                    raise
                raise named from e
            shutil.rmtree(self._staging, ignore_errors=True)  # empty now
            return False
        self._undo()
        named = self._named(exc)
        if named is not exc:
            raise named from exc
        return False

    def _named(self, error):
        """``error``, naming the report file being written if it is an ``OSError``."""
        if isinstance(error, OSError) and self._current is not None:
            return _naming(error, self._current)
        return error

    def _undo(self):
        """Remove what this call wrote."""
        shutil.rmtree(self._staging, ignore_errors=True)
        for path in self._moved:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        self._remove_made()

    def _remove_made(self):
        for directory in self._made:
            try:
                os.rmdir(directory)  # only while empty: nothing of anyone else's goes
            except OSError:
                return


class Animator:
    """Collect points of one or more lines and draw them into a chart file (no notebook needed).

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
            # Lines that coincide (kvstores that agree) stay visible: styles differ.
            ax.plot(xs, ys, marker='osD^v'[i % 5], linestyle=['-', '--', ':', '-.'][i % 4],
                    markersize=10 - 2 * (i % 3), fillstyle='none', label=label)
        values = sorted({x for xs in self.X or [] for x in xs})
        if values and all(isinstance(x, int) for x in values):  # epochs, not fractions
            if len(values) <= 20:
                ax.set_xticks(values)
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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
        """Write the figure to ``path``, atomically, as PNG, SVG or PDF by its extension."""
        check_chart_path(path, 'chart')  # before drawing
        save_figure(self.figure(), path)


def duration(seconds):
    """``seconds`` as a short text: ``45 s``, ``12 min``, ``3.2 h``."""
    if seconds < 90:
        return f'{seconds:.0f} s'
    if seconds < 90 * 60:
        return f'{seconds / 60:.0f} min'
    return f'{seconds / 3600:.1f} h'


class Progress(Hook):
    """A ``train`` hook that reports progress within an epoch, at most every ``interval`` s.

    A line gives the run's label, the epoch, the steps done of the epoch's,
    images/s, and the estimated time left for the epoch and for the run.
    Once per run, when the first measured steps put an epoch above
    ``slow_epoch`` seconds, ``say`` gets the estimate and ``advice``.

    Parameters
    ----------
    say : callable
        Takes one line of text.
    interval : float
        Seconds between lines (0: no lines, the slow-run estimate only).
    label : str
        Names the run (its kvstore and devices), first on every line.
    num_epochs : int, optional
        Epochs of the run, for the time left of the run.
    slow_epoch : float
        Seconds per epoch above which the estimate is said.
    advice : str
        What to do instead of a slow run.
    """

    def __init__(self, say, interval=10.0, label='', num_epochs=None, slow_epoch=600.0,
                 advice=''):
        self.say, self.interval, self.label = say, interval, label
        self.num_epochs, self.slow_epoch, self.advice = num_epochs, slow_epoch, advice
        self._epoch = self._due = self._first = None
        self._warned = False

    def step_end(self, run, step, samples, timer):
        if self._epoch != run.epoch:  # a new epoch (or the resumed part of one)
            self._epoch, self._first = run.epoch, step
            self._due = self.interval if self.interval > 0 else 30.0
        if timer.elapsed() < self._due or step == self._first:
            return
        npx.waitall()  # Sync point: the figures of a progress line are the devices' own.
        seconds = timer.elapsed()
        self._due = seconds + (self.interval if self.interval > 0 else 30.0)
        total = len(run.train_iter) if hasattr(run.train_iter, '__len__') else None
        per_step = seconds / (step - self._first + 1)
        epoch_left = per_step * (total - step) if total else None
        if epoch_left is not None and not self._warned and per_step * total > self.slow_epoch:
            self._warned = True
            self.say(f'{self.label}: at {samples / seconds:.0f} images/s an epoch takes about '
                     f'{duration(per_step * total)}'
                     + (f', the run about {duration(per_step * total * self.num_epochs)}'
                        if self.num_epochs else '') + (f'; {self.advice}' if self.advice else ''))
        if self.interval <= 0:
            return
        left = ''
        if epoch_left is not None:
            left = f', epoch ends in {duration(epoch_left)}'
            if self.num_epochs:
                run_left = epoch_left + per_step * total * (self.num_epochs - run.epoch)
                left += f', run in {duration(run_left)}'
        self.say(f'  {self.label}: epoch {run.epoch}: {step}/{total or "?"} batches, '
                 f'{samples / seconds:.0f} images/s{left}')


def epoch_line(record, num_epochs):
    """Return the line of one epoch (an ``EpochRecord``); the text's loop has no training figures."""
    train = ('' if record.train_loss is None else
             f'loss {record.train_loss:.4f}, train acc {record.train_acc:.3f}, ')
    test = '' if record.test_acc is None else f'test acc {record.test_acc:.3f}, '
    return (f'epoch {record.epoch}/{num_epochs}: {train}{test}{record.seconds:.1f} s, '
            f'{record.samples_per_sec:.0f} samples/s')


def markdown_table(header, rows, align):
    """Return a Markdown table: ``header`` and each row a list of cells, ``align`` one of
    ``l``/``r`` per column."""
    rule = ['---' if a == 'l' else '---:' for a in align]
    return '\n'.join('| ' + ' | '.join(map(str, cells)) + ' |' for cells in [header, rule, *rows])


def _fmt_diffs(values):
    return ', '.join(v if isinstance(v, str) else '0' if v == 0 else f'{v:.1e}' for v in values)


def comparison_table(results, tracker=None):
    """Return a Markdown table comparing several ``TrainResult`` objects side by side.

    Parameters
    ----------
    results : list of TrainResult
    tracker : compare.ParamTracker, optional
        Adds, per kvstore, the largest parameter difference to the reference
        run after each epoch, and the largest difference between the devices
        of the run: of the weights, and of BatchNorm's running statistics.
    """
    header = '| kvstore | devices | sec/epoch | samples/s | final test acc |'
    rule = '| --- | --- | ---: | ---: | ---: |'
    if tracker is not None:
        header += (f' max abs param diff vs {tracker.reference}, per epoch | weights: max diff '
                   'between devices | running stats: max diff between devices |')
        rule += ' --- | ---: | ---: |'
    rows = [header, rule]
    for r in results:
        row = (f'| {r.kvstore} | {", ".join(r.devices)} | {r.sec_per_epoch:.2f} | '
               f'{r.samples_per_sec:.0f} | {r.test_acc[-1]:.4f} |')
        if tracker is not None:
            diff = tracker.diff.get(r.kvstore) or ['-']
            spread = tracker.spread.get(r.kvstore)
            stats = tracker.stats_spread.get(r.kvstore)
            stats = '-' if not stats else 'none kept' if None in stats else _fmt_diffs([max(stats)])
            row += (f' {_fmt_diffs(diff)} | {_fmt_diffs([max(spread)]) if spread else "-"} | '
                    f'{stats} |')
        rows.append(row)
    return '\n'.join(rows)


def bar_chart(path, labels, values, ylabel, title=None, figsize=(5, 3.5), fmt='%.2f'):
    """Write a bar chart of ``values`` (one bar per label, value printed on it as ``fmt``).

    PNG, SVG or PDF, as the extension of ``path`` says.
    """
    check_chart_path(path, 'chart')
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bars = ax.bar(labels, values, color='tab:blue')
    ax.margins(y=0.12)  # room for the value labels
    ax.bar_label(bars, fmt=fmt)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, axis='y', alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def accuracy_chart(path, results, title=None):
    """Write the test accuracy per epoch of several ``TrainResult`` objects on one chart.

    PNG, SVG or PDF, as the extension of ``path`` says; an ``OSError`` names ``path``.
    """
    check_chart_path(path, 'chart')
    num_epochs = max(len(r.epochs) for r in results)
    animator = Animator(xlabel='epoch', ylabel='test acc',
                        legend=[f'kvstore {r.kvstore}' for r in results],
                        xlim=[0.5, num_epochs + 0.5], title=title)
    for i in range(num_epochs):
        animator.add(i + 1, [r.test_acc[i] if i < len(r.epochs) else None for r in results])
    animator.save(path)


def write_kvstore_report(directory, results, tracker, config, answer):
    """Write ``report.md``, ``accuracy.png``, ``seconds.png`` and ``runs.json`` into ``directory``.

    All or nothing (``ReportFolder``): the directory is created if missing,
    and a failure half-way (a full disk, an interruption) leaves it as it
    was, with an ``OSError`` naming the file it was writing.

    Parameters
    ----------
    results : list of TrainResult
        One run per kvstore, on the same devices, data and initial weights.
    tracker : ParamTracker
        The parameter differences recorded after each epoch.
    config : dict
        The run's settings (``model``, ``dataset``, ``batch_size``, ``lr``, ...).
    answer : str
        The recommendation sentence (``compare.recommend``).
    """
    devices = ', '.join(results[0].devices)
    what = f"{config['model']} on {config['dataset']}, [{devices}]"
    lines = [
        f'# kvstore comparison: {what}', '',
        f"{config['num_train']} training / {config['num_test']} test images, batch "
        f"{config['batch_size']} ({config['batch_size'] / len(results[0].devices):g} per device), "
        f"lr {config['lr']:g}, {len(results[0].epochs)} epoch(s), seed {config['seed']}; every "
        'kvstore started from the same initial weights and saw the same batches.', '',
        f'**Answer:** {answer}', '',
        comparison_table(results, tracker), '',
        'sec/epoch is training time only, measured up to `npx.waitall()`; samples/s is over all '
        'epochs. The parameter differences are the largest absolute difference of any weight '
        f'to the {tracker.reference} run after each epoch (float rounding when the back ends '
        'agree), and the largest difference between the copies on the devices of one run: '
        '0 for the weights when every device holds the same parameters. BatchNorm\'s running '
        'mean and variance are not synchronised: MXNet keeps them per device, each updated '
        'from that device\'s shards only (so does the book\'s code), and each device '
        'evaluates its shard of a test batch with its own.', '',
        '![test accuracy per epoch](accuracy.png)', '',
        '![training seconds per epoch](seconds.png)', '',
        'For how many devices to use, run `python scripts/scaling.py` (speedup and efficiency '
        'per device count) and `python scripts/bandwidth.py` (synchronisation cost against '
        'compute per step).', '']
    with ReportFolder(directory) as folder:
        accuracy_chart(folder.path('accuracy.png'), results, title=what)
        bar_chart(folder.path('seconds.png'), [r.kvstore for r in results],
                  [r.sec_per_epoch for r in results], 'training seconds per epoch', title=what)
        write_json(folder.path('runs.json'), {
            'config': config, 'reference': tracker.reference,
            'runs': [tracker.run_dict(r) for r in results]})
        with atomic_write(folder.path('report.md')) as f:
            f.write('\n'.join(lines))

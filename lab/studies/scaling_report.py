"""The reports of ``scripts/bandwidth.py`` and ``scripts/scaling.py``: tables, answers, charts, files.

The figures come from ``scaling`` (the arithmetic) and ``measure`` (the
measurements); this module turns them into Markdown, sentences, charts (PNG,
SVG or PDF by the extension) and the output directory of a sweep. Like
``scaling``, it does not import MXNet (it draws with matplotlib).
"""
import statistics

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gluon_multigpu.study.paired import MIN_EFFECT as NOISE
from gluon_multigpu.filesafety.output import ReportSet, atomic_write
from gluon_multigpu.study.charts import check_chart_path, save_figure
from gluon_multigpu.study.kvstore_report import markdown_table
from lab.studies.counts import device_counts
from lab.studies.csvfiles import STAMP_COLUMNS, stamped, write_csv
from lab.studies.scaling_model import MEASURED_COLUMNS, PROJECTION_COLUMNS, REFERENCE_BATCH, SYNC_COLUMNS, \
    WARMUP_STEPS

__all__ = ['bandwidth_table', 'bandwidth_summary', 'scaling_table', 'measured_speedup',
           'projection_table', 'how_many_devices', 'fastest_kvstores', 'accuracy_answer',
           'speedup_chart', 'efficiency_chart', 'accuracy_batch_chart', 'scaling_report',
           'write_scaling_outputs']


def _num(x, fmt):
    return '' if x is None else format(x, fmt)


def bandwidth_table(rows):
    """Return the Markdown table of ``bandwidth_row`` dicts."""
    def cells(r):
        compute = (f"{r['compute_s'] * 1e3:.1f} ({r['batch_per_device']})"
                   if r['compute_s'] is not None else '')
        return [r['model'], f"{r['devices']} {r['device_type']}", r['kvstore'],
                f"{r['grad_bytes'] / 1e6:.2f}", f"{r['sync_s'] * 1e3:.2f}", f"{r['alg_gbps']:.3f}",
                f"{r['bus_gbps']:.3f}", compute, _num(r['sync_per_compute'], '.4f')]
    return markdown_table(['model', 'devices', 'kvstore', 'gradient MB', 'sync ms', 'alg GB/s',
                           'bus GB/s', 'compute ms (batch/device)', 'sync / compute'],
                          [cells(r) for r in rows], 'lrlrrrrrr')


def bandwidth_summary(rows):
    """Return one line per model: synchronisation against compute (the section's argument)."""
    lines = []
    for model in dict.fromkeys(r['model'] for r in rows):
        mine = [r for r in rows if r['model'] == model and r['sync_per_compute'] is not None]
        if not mine:
            continue
        lo = min(mine, key=lambda r: r['sync_per_compute'])
        hi = max(mine, key=lambda r: r['sync_per_compute'])
        lines.append(
            f"{model} ({mine[0]['params']:,} parameters, {mine[0]['grad_bytes'] / 1e6:.1f} MB of "
            f"gradients): one synchronisation costs {lo['sync_per_compute']:.1%} "
            f"({lo['kvstore']}, {lo['devices']} devices) to {hi['sync_per_compute']:.1%} "
            f"({hi['kvstore']}, {hi['devices']} devices) of a step's forward and backward pass "
            f"at {mine[0]['batch_per_device']} samples per device.")
    return lines


def _pct(x):
    return '' if x is None else f'{x:.0%}'


def _speed_only(rows):
    """Whether ``rows`` are speed measurements (``steps_row``): no epochs, no accuracy."""
    return bool(rows) and all(r['kind'] == 'steps' for r in rows)


def scaling_table(rows):
    """Return the Markdown table of the measured runs (speed measurements: ms per step, no
    test accuracy)."""
    speed = _speed_only(rows)

    def cells(r):
        figures = [_num(r['sec_per_step'] and r['sec_per_step'] * 1e3, '.1f') if speed
                   else _num(r['sec_per_epoch'], '.2f'), _num(r['samples_per_sec'], '.0f'),
                   _num(r['speedup'], '.2f'), _pct(r['efficiency'])]
        figures += [] if speed else [_num(r['test_acc'], '.4f')]
        if r['status'] != 'ok':
            figures = [r['status']] + [''] * (len(figures) - 1)
        return [r['devices'], r['kvstore'], f"{r['batch_size']} ({r['per_device_batch']:g})",
                r['lr_rule'], f"{r['lr']:g}", *figures]
    heads = ['ms/step', 'samples/s', 'speedup', 'efficiency'] if speed else \
        ['sec/epoch', 'samples/s', 'speedup', 'efficiency', 'test acc']
    return markdown_table(['devices', 'kvstore', 'batch (per device)', 'lr rule', 'lr', *heads],
                          [cells(r) for r in rows], 'rlrl' + 'r' * (len(heads) + 1))


def measured_speedup(rows, kvstore, batch_mode, batch_size, devices):
    """The median measured speedup of the runs matching a projection row (over lr rules) or None."""
    found = [r['speedup'] for r in rows
             if r['kvstore'] == kvstore and r['batch_mode'] == batch_mode
             and r['batch_size'] == batch_size and r['devices'] == devices
             and r['speedup'] is not None]
    return statistics.median(found) if found else None


def projection_table(rows, measured=()):
    """Return the Markdown table of ``projection_rows``, with the measured speedup where known."""
    def cells(r):
        real = measured_speedup(measured, r['kvstore'], r['batch_mode'], r['batch_size'],
                                r['devices'])
        return [r['devices'], r['kvstore'], f"{r['batch_size']} ({r['per_device_batch']:g})",
                f"{r['t_compute_s'] * 1e3:.1f}", f"{r['t_sync_s'] * 1e3:.1f}",
                f"{r['t_step_s'] * 1e3:.1f}", f"{r['samples_per_sec']:.0f}",
                _num(r['speedup'], '.2f'), _pct(r['efficiency']), _num(real, '.2f')]
    return markdown_table(['devices', 'kvstore', 'batch (per device)', 't_compute ms',
                           't_sync ms', 't_step ms', 'samples/s', 'speedup', 'efficiency',
                           'measured speedup'], [cells(r) for r in rows], 'rlrrrrrrrr')


def _devices(n):
    return f'{n} device' if n == 1 else f'{n} devices'


def _describe(r):
    return (f"kvstore {r['kvstore']}, batch {r['batch_size']} ({r['per_device_batch']:g} per "
            f"device), lr rule {r['lr_rule']} (lr {r['lr']:g})")


def how_many_devices(rows):
    """Return the answer to "how many devices": the best throughput, each count's efficiency."""
    ok = [r for r in rows if r['samples_per_sec']]
    if not ok:
        return ['No run finished, so there is no answer.']
    best = max(ok, key=lambda r: r['samples_per_sec'])
    lines = [f"Best throughput: **{_devices(best['devices'])}**, {best['samples_per_sec']:.0f} "
             f"samples/s ({_describe(best)}).", '',
             'The fastest run at each count and its efficiency:']
    for n in sorted({r['devices'] for r in ok}):
        top = max((r for r in ok if r['devices'] == n), key=lambda r: r['samples_per_sec'])
        eff = ('efficiency n/a: no 1-device run of this series' if top['efficiency'] is None
               else f"speedup {top['speedup']:.2f}, efficiency {top['efficiency']:.0%}")
        lines.append(f"- {_devices(n)}: {top['samples_per_sec']:.0f} samples/s, {eff} "
                     f"({_describe(top)})")
    return lines


def fastest_kvstores(rows, noise=NOISE):
    """Return the answer lines to "local or device": the fastest kvstore per device count.

    Runs are compared within the same count, batch and learning-rate rule, by
    the rounds they share (a row's ``rounds``: its samples/s in each round,
    the configurations taken in turn; ``study.paired``): a kvstore is named
    faster only when the interval of its paired ratio excludes 1 and the
    difference is ``noise`` or more; with one round each no winner is named.
    One device is left out: MXNet's Trainer makes no kvstore for a single
    device. Empty when only one kvstore was run.
    """
    from gluon_multigpu.study.paired import Paired
    from lab.studies.verdicts import versus
    ok = [r for r in rows if r['samples_per_sec'] and r['devices'] > 1]
    if len({r['kvstore'] for r in rows}) < 2:
        return []
    groups = {}
    for r in ok:
        groups.setdefault((r['devices'], r['batch_mode'], r['batch_size'], r['lr_rule']),
                          []).append(r)
    lines = []
    for (n, _, batch, rule), group in sorted(groups.items(), key=lambda kv: kv[0][:1] + kv[0][2:]):
        if len(group) < 2:
            continue
        group.sort(key=lambda r: -r['samples_per_sec'])
        best = group[0]
        pairs = Paired([r['kvstore'] for r in group], higher_is_better=True, min_effect=noise,
                       warmup=0)  # every measurement is warmed (scaling.WARMUP_STEPS)
        for r in group:
            for i, speed in enumerate(r.get('rounds') or [r['samples_per_sec']], 1):
                pairs.add(r['kvstore'], i, speed)
        against = {r['kvstore']: versus(pairs, best['kvstore'], r['kvstore']) for r in group[1:]}
        rest = ', '.join(f"{r['kvstore']} {r['samples_per_sec']:.0f} "
                         f"({1 - r['samples_per_sec'] / best['samples_per_sec']:.0%} slower"
                         + (f", 95% interval of {best['kvstore']}'s speed-up "
                            f"{against[r['kvstore']]['low']:.2f}-"
                            f"{against[r['kvstore']]['high']:.2f}"
                            if against[r['kvstore']]['low'] is not None else '') + ')'
                         for r in group[1:])
        rounds = len(pairs.rounds())
        if rounds < 2:
            verdict = (f"{best['kvstore']} faster in the one round measured, which cannot tell "
                       'a difference from noise (measure 3 rounds or more)')
        else:
            ties = [k for k, v in against.items() if v['verdict'] == 'equally fast']
            unsure = [k for k, v in against.items() if v['verdict'] == 'cannot tell']
            clauses = [f"{' and '.join([best['kvstore']] + ties)} equally fast (the whole "
                       f'interval within {1 - noise:.2f}-{1 + noise:.2f})'] if ties else []
            clauses += [f"cannot tell at this load whether {best['kvstore']} or {k} is faster "
                        '(more rounds or a quieter machine would tell)' for k in unsure]
            verdict = ('; '.join(clauses) if clauses else f"**{best['kvstore']}** fastest") + \
                f' ({rounds} rounds)'
        lines.append(f"- {_devices(n)}, batch {batch}, lr rule {rule}: {verdict}: "
                     f"{best['kvstore']} {best['samples_per_sec']:.0f} samples/s, {rest}")
    if not lines:
        lines.append('- no count of 2 or more devices ran with several kvstores')
    return lines


def accuracy_answer(rows):
    """Return a line naming the run with the best final test accuracy, per learning-rate rule."""
    ok = [r for r in rows if r['test_acc'] is not None]
    lines = []
    for rule in dict.fromkeys(r['lr_rule'] for r in rows):
        mine = [r for r in ok if r['lr_rule'] == rule]
        if not mine:
            lines.append(f'- lr rule {rule}: no run finished')
            continue
        best = max(mine, key=lambda r: r['test_acc'])
        worst = min(mine, key=lambda r: r['test_acc'])
        lines.append(f"- lr rule {rule}: best {best['test_acc']:.4f} at batch "
                     f"{best['batch_size']} on {_devices(best['devices'])} (lr {best['lr']:g}), "
                     f"worst {worst['test_acc']:.4f} at batch {worst['batch_size']} "
                     f"(lr {worst['lr']:g})")
    failed = [r for r in rows if r['status'] != 'ok']
    if failed:
        lines.append(f"- {len(failed)} run(s) {failed[0]['status']}: "
                     + '; '.join(f"{_devices(r['devices'])}, batch {r['batch_size']}, lr "
                                 f"{r['lr']:g}" for r in failed))
    return lines


def _chart(path, lines, xlabel, ylabel, title=None, logx=False):
    """Draw ``lines`` (dicts: label, x, y, optional style) into a chart at ``path``, atomically.

    PNG, SVG or PDF, as the extension of ``path`` says.
    """
    check_chart_path(path, 'chart')
    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for line in lines:
        ax.plot(line['x'], line['y'], line.get('style', 'o-'), label=line['label'])
    if logx:
        ax.set_xscale('log', base=2)
    xs = sorted({x for line in lines for x in line['x']})
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([f'{x:g}' for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def _series_label(r):
    batch = (f"{r['per_device_batch']:g}/device" if r['batch_mode'] == 'per-device'
             else f"global {r['batch_size']}")
    rule = f", {r['lr_rule']}" if 'lr_rule' in r else ''
    return f"{r['kvstore']}, {batch}{rule}"


def _lines_by_series(rows, field, style):
    series = {}
    for r in sorted(rows, key=lambda r: r['devices']):
        if r[field] is not None:
            line = series.setdefault(_series_label(r), {'label': _series_label(r), 'x': [],
                                                         'y': [], 'style': style})
            line['x'].append(r['devices'])
            line['y'].append(r[field])
    return list(series.values())


def _measured_and_projected(path, rows, projection, field, ideal, ylabel, title):
    """A chart of ``field`` against device count: measured series, the projection (dashed),
    and the ideal line (``ideal(n)`` for n devices)."""
    lines = _lines_by_series(rows, field, 'o-')
    for line in _lines_by_series(projection, field, 's--'):
        line['label'] = f"model: {line['label']}"
        lines.append(line)
    counts = sorted({r['devices'] for r in list(rows) + list(projection)})
    lines.append({'label': ideal[0], 'x': counts, 'y': [ideal[1](n) for n in counts],
                  'style': 'k:'})
    _chart(path, lines, 'devices', ylabel, title, logx=True)


def speedup_chart(path, rows, projection=(), title=None):
    """Speedup against device count: measured series, the projection (dashed), the ideal line."""
    _measured_and_projected(path, rows, projection, 'speedup', ('ideal (linear)', float),
                            'speedup over 1 device', title)


def efficiency_chart(path, rows, projection=(), title=None):
    """Efficiency (speedup / devices) against device count, measured and projected."""
    _measured_and_projected(path, rows, projection, 'efficiency', ('ideal', lambda n: 1.0),
                            'efficiency (speedup / devices)', title)


def accuracy_batch_chart(path, rows, title=None):
    """Final test accuracy against the global batch, a line per lr rule (mean per batch)."""
    lines = []
    for rule in dict.fromkeys(r['lr_rule'] for r in rows):
        accs = {}
        for r in rows:
            if r['lr_rule'] == rule and r['test_acc'] is not None:
                accs.setdefault(r['batch_size'], []).append(r['test_acc'])
        xs = sorted(accs)
        lines.append({'label': f'lr rule {rule}', 'x': xs,
                      'y': [statistics.mean(accs[x]) for x in xs]})
    _chart(path, lines, 'global batch size', 'final test accuracy', title, logx=True)


def scaling_report(config, rows, projection, sync_rows, notes=()):
    """Return ``report.md`` of a sweep as text.

    (More: lab/NOTES.md.)
    """
    speed = config.get('mode') == 'speed'
    lines = _report_header(config, notes) + _report_answer(rows, speed) + \
        _report_measured(rows, speed)
    lines += ['## Projection to more devices (a model, not a measurement)', '']
    if not projection:
        lines += ['No projection: it needs a synchronisation measured on at least 2 devices.', '']
    else:
        lines += _report_projection(config, projection, rows, sync_rows)
    lines += [f"Files: `scaling.csv` (measured runs), `projection.csv`, `sync.csv`, the "
              f"{'two' if speed else 'three'} PNG charts.", '']
    return '\n'.join(lines)


def _report_header(c, notes):
    """The report's title, the sweep's settings and its ``notes``."""
    what = (f"{c['steps']} timed training steps of each configuration after {WARMUP_STEPS} "
            f"untimed ones (its speed; `--full` trains to the end and measures accuracy)"
            if c.get('mode') == 'speed' else
            f"{c['num_train']} training / {c['num_test']} test images, {c['epochs']} epoch(s)")
    lines = [f"# Scaling: {c['model']} on {c['dataset']}, {c['device_type']} devices "
             f"{', '.join(map(str, c['counts']))}", '',
             f"{what}, seed {c['seed']}, base learning rate {c['base_lr']:g} per "
             f"{REFERENCE_BATCH} samples; every run starts from the same initial weights and "
             f"sees the same data. Engine: {c['engine']}.", '']
    return lines + [f'> {n}' for n in notes] + ([''] if notes else [])


def _report_answer(rows, speed=False):
    """The section's questions answered from the measured ``rows`` (``speed``: speed only)."""
    lines = ['## Answer', '', '### How many devices', ''] + how_many_devices(rows) + ['']
    kv = fastest_kvstores(rows)
    if kv:
        lines += ['### local or device', ''] + kv + ['']
    accuracy = ['Not measured: this sweep measured speed over a few steps; `--full` trains '
                'every configuration to the end and answers it.'] if speed \
        else accuracy_answer(rows)
    return lines + ['### Accuracy, batch size and learning rate', ''] + accuracy + ['']


def _report_measured(rows, speed=False):
    """The measured runs' table, what its columns mean, and the charts."""
    timed = (f'samples/s and ms/step: training time up to `npx.waitall()` of the timed steps, '
             f'after {WARMUP_STEPS} untimed ones (the first compiles the graph).') if speed else \
        ('samples/s and sec/epoch: training time up to `npx.waitall()`, evaluation excluded, '
         'over every epoch but the first when there are two or more (the first also compiles '
         'the graph).')
    charts = ['![speedup against devices](speedup.png)', '',
              '![efficiency against devices](efficiency.png)', '']
    if not speed:
        charts += ['![final test accuracy against batch size](accuracy.png)', '']
    return [
        '## Measured', '', scaling_table(rows), '',
        f'{timed} **speedup** = samples/s on N devices / samples/s of the 1-device run with the '
        'same kvstore, learning-rate rule and per-device batch (with a fixed global batch: the '
        'same global batch); **efficiency** = speedup / N. Learning-rate rules, B the global '
        f'batch: linear = base x B / {REFERENCE_BATCH} (the book), fixed = base, sqrt = base x '
        f'sqrt(B / {REFERENCE_BATCH}).', '', *charts]


def _report_projection(c, projection, rows, sync_rows):
    """The projection's model, its assumptions, its table and the synchronisations it fits."""
    slopes = {r['kvstore']: r['sync_slope_s'] for r in projection}
    return [
        f"Model: `t_step(N) = t_compute(b) + t_sync(N)`, `t_sync(N) = s (N - 1)`, throughput "
        f"= global batch / t_step(N), speedup = throughput(N) / throughput(1), efficiency = "
        f"speedup / N, for N = {', '.join(str(n) for n in device_counts(c['project_to']))}.",
        '',
        f"- `t_compute(b)`: one training step (forward, backward, SGD update) of the "
        f"per-device batch b on one device, measured (median of {c['compute_repeats']}).",
        f"- `s`: least-squares slope through the origin of the synchronisation times measured "
        f"below (median of {c['sync_repeats']} `allreduce_grads` each), per kvstore: "
        + ', '.join(f'{kv} {s * 1e3:.2f} ms per added device' for kv, s in slopes.items())
        + '.',
        '- Assumptions: synchronisation and compute do not overlap; loading a batch, '
        'splitting it and copying the shards to the devices cost nothing; every device is '
        'as fast as the measured one; the synchronisation cost keeps growing linearly in '
        'N - 1 beyond the counts measured (tree or ring all-reduce over a fast interconnect '
        'grows more slowly, a shared bus may grow faster).', '',
        projection_table(projection, rows), '',
        'The last column is the measured speedup of the same kvstore and batch (median over '
        'lr rules) where the sweep ran that count: the gap between the two is what the '
        'assumptions leave out (loading and splitting each batch, Python overhead, devices '
        'that share cores or memory bandwidth).', '',
        'Synchronisations measured for the fit:', '', bandwidth_table(sync_rows), '']


def write_scaling_outputs(directory, config, rows, projection, sync_rows, notes=()):
    """Write ``scaling.csv``, ``projection.csv``, ``sync.csv``, the charts and ``report.md``.

    All or nothing (``output.ReportSet``): ``directory`` is created if
    missing, and a failure half-way (a full disk, an interruption) leaves it
    as it was, with an ``OSError`` naming the file it was writing. Returns
    the names of the files written: no ``accuracy.png`` for a speed sweep
    (``config['mode']`` ``speed``), which measures no accuracy.
    """
    what = f"{config['model']}, {config['device_type']} devices"
    speed = config.get('mode') == 'speed'
    with ReportSet(directory) as folder:
        write_csv(folder.path('scaling.csv'), stamped(rows), MEASURED_COLUMNS + STAMP_COLUMNS)
        write_csv(folder.path('projection.csv'), stamped(projection),
                  PROJECTION_COLUMNS + STAMP_COLUMNS)
        write_csv(folder.path('sync.csv'), stamped(sync_rows), SYNC_COLUMNS + STAMP_COLUMNS)
        speedup_chart(folder.path('speedup.png'), rows, projection, title=what)
        efficiency_chart(folder.path('efficiency.png'), rows, projection, title=what)
        if not speed:
            accuracy_batch_chart(folder.path('accuracy.png'), rows, title=what)
        with atomic_write(folder.path('report.md')) as f:
            f.write(scaling_report(config, rows, projection, sync_rows, notes))
    return ['scaling.csv', 'projection.csv', 'sync.csv', 'speedup.png', 'efficiency.png',
            *([] if speed else ['accuracy.png']), 'report.md']

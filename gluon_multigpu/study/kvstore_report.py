"""The kvstore comparison: its side-by-side table and its report folder."""
from ..base.machine import stamp
from ..section.devices import even_shares
from .compare import epoch_load, paired_epochs
from .paired import _span
from ..filesafety.files import write_json, write_text
from ..filesafety.output import ReportSet
from .charts import accuracy_chart, seconds_chart

__all__ = ['markdown_table', 'comparison_table', 'rounds_table', 'batch_norm_sentence', 'runs_json',
           'write_kvstore_report']


def markdown_table(header, rows, align):
    """Return a Markdown table: ``header`` and each row a list of cells, ``align`` one of
    ``l``/``r`` per column."""
    rule = ['---' if a == 'l' else '---:' for a in align]
    return '\n'.join('| ' + ' | '.join(map(str, cells)) + ' |' for cells in [header, rule, *rows])


def _fmt_diffs(values):
    return ', '.join(v if isinstance(v, str) else '0' if v == 0 else f'{v:.1e}' for v in values)


def _ratio_cell(pairs, kvstore, best):
    """``1.19x (0.82-1.61): cannot tell``: ``kvstore``'s time against ``best``'s, as the answer
    judges it."""
    if kvstore == best:
        return 'reference'
    if (r := pairs.ratio(kvstore, best)) is None:
        return '-'
    interval = f'{r.low:.2f}-{r.high:.2f}' if r.low is not None else '1 round'
    verdict = r.verdict(pairs.min_effect)
    return f'{r.median:.2f}x ({interval}): {"equally fast" if verdict == "equal" else verdict}'


def comparison_table(results, tracker=None):
    """Return a Markdown table comparing several ``TrainResult`` objects side by side.

    With several, each kvstore's time against the fastest's comes beside its
    mean: the paired ratio, its 95% interval and the answer (``compare.recommend``).

    Parameters
    ----------
    results : list of TrainResult
    tracker : compare.ParamTracker, optional
        Adds, per kvstore, the largest parameter difference to the reference
        run after each epoch, and the largest difference between the devices
        of the run: of the weights, and of BatchNorm's running statistics.
    """
    pairs = paired_epochs(results) if len(results) > 1 else None
    best = pairs.fastest() if pairs else None
    versus = [f'time vs {best} (95% interval): answer'] if best is not None else []
    header = ['kvstore', 'devices', 'sec/epoch', *versus, 'samples/s', 'final test acc']
    if tracker is not None:
        header += [f'max abs param diff vs {tracker.reference}, per epoch',
                   'weights: max diff between devices', 'running stats: max diff between devices']
    rows = []
    for r in results:
        ratio = [_ratio_cell(pairs, r.kvstore, best)] if best is not None else []
        row = [r.kvstore, ', '.join(r.devices), f'{r.sec_per_epoch:.2f}', *ratio,
               f'{r.samples_per_sec:.0f}', f'{r.test_acc[-1]:.4f}']
        if tracker is not None:
            spread = tracker.spread.get(r.kvstore)
            stats = tracker.stats_spread.get(r.kvstore)
            stats = '-' if not stats else 'none kept' if None in stats else _fmt_diffs([max(stats)])
            row += [_fmt_diffs(tracker.diff.get(r.kvstore) or ['-']),
                    _fmt_diffs([max(spread)]) if spread else '-', stats]
        rows.append(row)
    align = 'llr' + 'l' * (best is not None) + 'rr' + 'lrr' * (tracker is not None)
    return markdown_table(header, rows, align)


def rounds_table(results):
    """A Markdown table of every round: each kvstore's seconds for that epoch, and the load.

    The load columns give the range over the round's epochs of the CPU
    other processes used (cores) and of the load average (``paired.LoadMeter``).
    """
    rows = []
    for n in sorted({e.epoch for r in results for e in r.epochs}):
        loads = [epoch_load(r, n) for r in results]
        rows.append([str(n), *(next((f'{e.seconds:.2f}' for e in r.epochs if e.epoch == n), '-')
                               for r in results),
                     *('-' if not s else f'{s[0]:.1f}' if s[0] == s[1] else f'{s[0]:.1f}-{s[1]:.1f}'
                       for s in (_span(loads, 'others'), _span(loads, 'load')))])
    header = ['round (epoch)', *(f'{r.kvstore} s' for r in results), 'other processes (cores)']
    return markdown_table(header + ['load average'], rows, 'r' * (len(results) + 3))


def batch_norm_sentence(tracker, config):
    """What the report says of BatchNorm's statistics: '' for a network without BatchNorm.

    Whether the network has BatchNorm is what ``tracker`` recorded (running
    statistics, or None for none); ``config['sync_bn']`` says whether they
    were synchronised. Nothing recorded: nothing said.
    """
    if all(s is None for spreads in tracker.stats_spread.values() for s in spreads or ()):
        return ''
    if config.get('sync_bn'):
        return (' BatchNorm is synchronised: each layer\'s batch mean and variance are computed '
                'over all devices\' shards together, so the running mean and variance are the '
                'same on every device (the last column measures it), and every device evaluates '
                'its shard of a test batch with them.')
    return (' BatchNorm\'s running mean and variance are not synchronised: MXNet keeps them per '
            'device, each updated from that device\'s shards only (so does the book\'s code), '
            'and each device evaluates its shard of a test batch with its own.')


def runs_json(results, tracker, config, partial=None):
    """Every figure of the runs, as ``runs.json`` and ``--json`` hold them.

    ``partial`` (why the comparison is incomplete, or None) is kept as is:
    ``complete`` says whether every kvstore of ``config['kvstore']`` finished.
    """
    return {'config': config, 'complete': partial is None, 'partial': partial,
            'reference': tracker.reference, 'runs': [dict(tracker.run_dict(r), load=[
                epoch_load(r, e.epoch) for e in r.epochs]) for r in results],
            'paired': paired_epochs(results).to_dict() if len(results) > 1 else None, **stamp()}


def write_kvstore_report(directory, results, tracker, config, answer, partial=None):
    """Write ``report.md``, ``accuracy.png``, ``seconds.png`` and ``runs.json`` into ``directory``.

    All or nothing (``ReportSet``): the directory is created if missing,
    and a failure half-way (a full disk, an interruption) leaves it as it
    was, with an ``OSError`` naming the file it was writing.

    Parameters
    ----------
    directory : str
        The report's folder (created if missing; its parent must exist).
    results : list of TrainResult
        One run per kvstore, on the same devices, data and initial weights.
    tracker : ParamTracker
        The parameter differences recorded after each epoch.
    config : dict
        The run's settings (``model``, ``dataset``, ``batch_size``, ``lr``, ...; ``sync_bn``
        true when BatchNorm was synchronised).
    answer : str
        The recommendation sentence (``compare.recommend``).
    partial : str, optional
        Why the comparison is incomplete (stopped, or written while it ran): the report is
        titled partial and says so first.
    """
    what = f"{config['model']} on {config['dataset']}, [{', '.join(results[0].devices)}]"
    lines = [
        f'# kvstore comparison{" (partial)" if partial else ""}: {what}', '',
        *([f'> **Partial:** {partial}', ''] if partial else []),
        f"{config['num_train']} training / {config['num_test']} test images, batch "
        f"{config['batch_size']} ({even_shares(config['batch_size'], len(results[0].devices))}), "
        f"lr {config['lr']:g}, {len(results[0].epochs)} epoch(s), seed {config['seed']}; every "
        'kvstore started from the same initial weights and saw the same batches.', '',
        f'**Answer:** {answer}', '', comparison_table(results, tracker), '',
        *(['The kvstores took turns, epoch after epoch (round 1 in the order above, round 2 '
           'backwards, and so on), so that a change of the load falls on all of them; the answer '
           'compares the epochs of the same round (paired ratios, their 95% interval; round 1, '
           'which warms the process, is left out when later rounds exist). Each round, with the '
           'load measured during it:', '', rounds_table(results), ''] if len(results) > 1 else []),
        'sec/epoch is training time only, measured up to `npx.waitall()`, over every epoch; '
        'beside it, the paired ratio the answer judges, its 95% interval and the answer; '
        'samples/s is over all epochs. The parameter differences are the largest absolute '
        f'difference of any weight to the {tracker.reference} run after each epoch (float '
        'rounding when the back ends agree), and the largest difference between the copies on the '
        'devices of one run: 0 for the weights when every device holds the same parameters.'
        + batch_norm_sentence(tracker, config), '',
        '![test accuracy per epoch](accuracy.png)', '',
        '![training seconds of every round (round 1, the warm-up, not judged)](seconds.png)', '',
        'For how many devices to use, run `python scripts/scaling.py` (speedup and efficiency '
        'per device count) and `python scripts/bandwidth.py` (synchronisation cost against '
        'compute per step).', '']
    with ReportSet(directory) as folder:
        title = f'{what} (partial)' if partial else what
        accuracy_chart(folder.path('accuracy.png'), results, title=title)
        seconds_chart(folder.path('seconds.png'), results, title=title)
        write_json(folder.path('runs.json'), runs_json(results, tracker, config, partial))
        write_text(folder.path('report.md'), '\n'.join(lines))

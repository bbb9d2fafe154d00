"""The network study's table: a shaped run's measured step beside the model's predictions."""
from lab.hosts import cluster as _cluster
from lab.studies.network_model import LARGEST_KEY_BYTES, MODELS, gradient_bytes, predict

__all__ = ['ROW_COLUMNS', 'table_row', 'markdown_table']

#: The columns of a row of the table (``table_row``), in order.
ROW_COLUMNS = ['model', 'workers', 'bandwidth', 'batch', 'steps', 'grad_bytes',
               'largest_key_bytes', 'unshaped_s', 't_net_s', 'predicted_s', 'measured_s', 'ratio',
               'overlapped_s', 't_net_old_s', 'predicted_old_s', 'ratio_old', 'others_cores',
               'status']


def table_row(config, unshaped_s, measured_s, others_cores=None, status='ok'):
    """One row of the table: a shaped run's measured step beside the predictions.

    ``predicted_s`` is ``unshaped_s + t_net_s`` and ``ratio`` measured /
    predicted; ``overlapped_s`` is ``max(unshaped_s, t_net_s)``, the step if
    the network hid entirely behind the compute or the compute behind the
    network; ``*_old`` the same against the model as it was before
    (``predict``'s ``old``). Figures that need a time that is missing (None)
    are None.
    """
    row = dict.fromkeys(ROW_COLUMNS)
    row.update(model=config.model, workers=config.workers, bandwidth=config.bandwidth,
               batch=config.batch, steps=config.steps, grad_bytes=gradient_bytes(config.model),
               largest_key_bytes=LARGEST_KEY_BYTES[config.model], unshaped_s=unshaped_s,
               measured_s=measured_s, others_cores=others_cores, status=status)
    if unshaped_s is not None:
        new = predict(unshaped_s, config.model, config.workers, config.bandwidth)
        old = predict(unshaped_s, config.model, config.workers, config.bandwidth, old=True)
        row.update(t_net_s=new['t_net_s'], predicted_s=new['t_step_s'],
                   overlapped_s=new['t_step_min_s'], t_net_old_s=old['t_net_s'],
                   predicted_old_s=old['t_step_s'])
        if measured_s is not None:
            row.update(ratio=measured_s / new['t_step_s'], ratio_old=measured_s / old['t_step_s'])
    return row


def _sort_key(row):
    bw = _cluster.rate_bytes(row['bandwidth']) if row['bandwidth'] else 0.0
    return (MODELS.index(row['model']) if row['model'] in MODELS else len(MODELS), row['model'],
            row['workers'], bw)


def markdown_table(rows):
    """The rows as a Markdown table, sorted by model, workers and bandwidth; seconds per step.

    Columns: model, workers, bandwidth, unshaped step, predicted step,
    measured step, measured / predicted, the step with full overlap
    (``overlapped_s``), the old model's prediction and its ratio, and the CPU
    the machine's other processes used meanwhile (cores). A missing figure is
    a dash; a run without a step time says why.
    """
    def sec(x):
        return '-' if x is None else f'{x:.3f}'

    def ratio(x):
        return '-' if x is None else f'{x:.2f}'
    lines = ['| model | workers | bandwidth | unshaped step (s) | predicted step (s) | '
             'measured step (s) | measured / predicted | full overlap (s) | old model (s) | '
             'measured / old | others (cores) |',
             '| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
    for r in sorted(rows, key=_sort_key):
        measured = sec(r['measured_s'])
        if r['status'] != 'ok':
            measured += f" ({r['status']})"
        others = '-' if r['others_cores'] is None else f"{r['others_cores']:.2f}"
        lines.append(f"| {r['model']} | {r['workers']} | {r['bandwidth']} | "
                     f"{sec(r['unshaped_s'])} | {sec(r['predicted_s'])} | {measured} | "
                     f"{ratio(r['ratio'])} | {sec(r['overlapped_s'])} | "
                     f"{sec(r['predicted_old_s'])} | {ratio(r['ratio_old'])} | {others} |")
    return '\n'.join(lines) + '\n'

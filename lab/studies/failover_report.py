"""The failover study's table and progress lines, from the rows of ``failover_run.run_job``."""

__all__ = ['markdown_header', 'markdown_row', 'summary']

_COLUMNS = ['fault', 'injected', 'detected by', 'detect (s)', 'restart (s)', 'recover (s)',
            'lost (s)', 'exit', 'final parameters', "fault's host empty (s)", 'left on the hosts',
            'load']
_LEFT_ALIGNED = ('fault', 'injected', 'detected by', 'final parameters', 'left on the hosts')


def markdown_header():
    """The first two lines of the Markdown table (``markdown_row`` makes the others)."""
    aligns = ['---' if c in _LEFT_ALIGNED else '---:' for c in _COLUMNS]
    return f'| {" | ".join(_COLUMNS)} |\n| {" | ".join(aligns)} |\n'


def _sec(x, digits=1):
    return '-' if x is None else f'{x:.{digits}f}'


def markdown_row(row):
    """One line of the Markdown table for a row of ``run_job``."""
    reference = row['fault'] == 'reference'
    if row['fingerprint'] is None:
        params = '-'
    elif reference:
        params = f"`{row['fingerprint']}`"
    elif row['equal']:
        params = f"= reference (`{row['fingerprint']}`)"
    elif row['equal'] is False:
        params = f"**differ** (`{row['fingerprint']}`)"
    else:
        params = f"`{row['fingerprint']}`"
    if row['left']:
        left = '**' + '; '.join(f'host {h}: ' + ', '.join(p.split(None, 1)[-1][:60] for p in ps)
                                for h, ps in sorted(row['left'].items())) + '**'
    else:
        left = 'nothing'
        if row.get('cleared_s'):
            left += f' (after {row["cleared_s"]:.1f} s)'
    if row.get('sshd_sessions'):
        left += f', {row["sshd_sessions"]} sshd session(s)'
    if reference:
        detected_by, detect, restart, recover = '-', '-', '-', '-'
        lost = f"({row['duration_s']:.1f} s in all)"
    else:
        detected_by = row['detected_by'] or '**not detected**'
        detect, restart = _sec(row['detect_s']), _sec(row['restart_s'])
        recover, lost = _sec(row['recover_s']), _sec(row['lost_s'])
        if row['restarts'] > 1:
            restart += f" ({row['restarts']} restarts)"
    status = '**hung**' if row['hung'] else str(row['status'])
    cells = [row['label'], row['injected_at'] or ('-' if reference else '**not injected**'),
             detected_by, detect, restart, recover, lost, status, params,
             _sec(row.get('host_empty_s')), left, ' / '.join(f'{x:.1f}' for x in row['load'])]
    return '| ' + ' | '.join(c.replace('|', '/') for c in cells) + ' |\n'


def summary(row):
    """One line saying how a run went, for progress output."""
    if row['fault'] == 'reference':
        head = f"{row['duration_s']:.1f} s, exit {row['status']}, parameters {row['fingerprint']}"
    else:
        head = (f"detected in {_sec(row['detect_s'])} s ({row['detected_by'] or 'never'}), "
                f"restarted in {_sec(row['restart_s'])} s, recovered in {_sec(row['recover_s'])} "
                f"s, lost {_sec(row['lost_s'])} s, exit {row['status']}, parameters "
                f"{ {True: 'equal', False: 'DIFFER', None: '-'}[row['equal']] }, its host empty "
                f"after {_sec(row['host_empty_s'])} s")
    left = f"; LEFT: {row['left']}" if row['left'] else '; nothing left'
    problems = f"; PROBLEMS: {', '.join(row['problems'])}" if row['problems'] else ''
    return f"{head}{left} (load {' / '.join(map(str, row['load']))}){problems}"

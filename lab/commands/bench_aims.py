"""The benchmark's aims: the ratios its table judges, computed from the measurements' medians,
with the 95% interval of each ratio's rounds beside it (``summarize``), and its tables."""
import importlib.util
import statistics

INSTALL_TORCH = "pip install -e '.[bench]'"
#: The global batch of the training-speed aims, on 2 contexts (the quick run uses its own)
TARGET_BATCH = 128
#: The book's batch for ResNet-18 (256 a device on two devices): measured beside the target's
BOOK_BATCH = 512

TARGETS = [  # key, what, comparison, threshold
    ('resnet_vs_pytorch_short', 'ResNet-18 short run (start-up included) images/s, ours '
     '(2 contexts) / PyTorch CPU', '>=', 1.1),
    ('resnet_vs_pytorch', 'ResNet-18 steady-state images/s, ours (2 contexts) / PyTorch CPU',
     '>=', 1.2),
    ('resnet_speedup', 'ResNet-18 steady-state images/s, ours / book (2 contexts)', '>=', 1.8),
    ('book_batch', 'ResNet-18 steady-state images/s, ours (2 contexts): the book\'s batch 512 '
     '(256 a context) / batch 128', '>=', 1.0),
    ('two_vs_one', 'ResNet-18 steady-state images/s, ours: 2 contexts / 1 context (same global '
     'batch)', '>=', 0.95),
    ('flop_efficiency', 'ResNet-18 achieved GFLOP/s (ours, 2 contexts) / measured '
     'matrix-multiply GFLOP/s', '>=', 0.85),
    ('cnn_vs_pytorch_short', 'small CNN short run (start-up included) images/s, ours '
     '(2 contexts) / PyTorch CPU', '>=', 1.0),
    ('cnn_vs_pytorch', 'small CNN steady-state images/s, ours (2 contexts) / PyTorch CPU',
     '>=', 1.0),
    ('resnet_memory', 'ResNet-18 peak MiB, ours (2 contexts) / PyTorch CPU', '<=', 1.2),
    ('bf16_speedup_short', 'ResNet-18 short run (start-up included) images/s, ours (2 contexts): '
     'bfloat16 / float32', '>=', 1.5),
    ('bf16_speedup', 'ResNet-18 steady-state images/s, ours (2 contexts): bfloat16 / float32',
     '>=', 1.5),
    ('bf16_vs_pytorch_short', 'ResNet-18 bfloat16 short run (start-up included) images/s, ours '
     '(2 contexts) / PyTorch autocast', '>=', 1.0),
    ('bf16_vs_pytorch', 'ResNet-18 bfloat16 steady-state images/s, ours (2 contexts) / PyTorch '
     'autocast', '>=', 1.0),
    ('bf16_memory', 'ResNet-18 bfloat16 peak MiB, ours (2 contexts) / PyTorch autocast', '<=',
     1.2),
    ('bf16_flop_efficiency', 'ResNet-18 bfloat16 achieved GFLOP/s (ours, 2 contexts) / '
     'bfloat16 matrix-multiply GFLOP/s (PyTorch)', '>=', 0.85),
    ('cnn_memory', 'small CNN peak MiB, ours (2 contexts) / PyTorch CPU', '<=', 1.2),
    ('pipeline', 'data pipeline images/s, ours / book-style DataLoader', '>=', 20.0),
    ('e2e_time', 'end to end (simple CNN, 2 epochs, real data): epoch wall time, ours / book',
     '<=', 0.5),
    ('e2e_accuracy', 'end to end: |test acc ours - book| (points)', '<=', 1.0),
    ('memory_growth', 'ours: resident memory growth, epoch 1 to epoch 3', '<=', 0.05),
]

def median_of(runs, field):
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def pairs(target_batch=TARGET_BATCH, book_batch=BOOK_BATCH):
    """The aims that set one measurement against another, round by round: key -> (the
    measurement, the reference, the field compared)."""
    ours, cnn = (f'train/{m}/2/device/{target_batch}/ours' for m in ('resnet18', 'simple-cnn'))
    torch, torch_cnn = (f'pytorch/{m}/{target_batch}' for m in ('resnet18', 'simple-cnn'))
    bf16, torch_bf16 = ours + '/bfloat16', torch + '/bfloat16'
    steady, short, peak = 'images_per_sec', 'short_images_per_sec', 'peak_mb'
    return {
        'resnet_vs_pytorch_short': (ours, torch, short), 'resnet_vs_pytorch': (ours, torch, steady),
        'resnet_speedup': (ours, f'train/resnet18/2/device/{target_batch}/book', steady),
        'book_batch': (f'train/resnet18/2/device/{book_batch}/ours', ours, steady),
        'two_vs_one': (ours, f'train/resnet18/1/device/{target_batch}/ours', steady),
        'cnn_vs_pytorch_short': (cnn, torch_cnn, short), 'cnn_vs_pytorch': (cnn, torch_cnn, steady),
        'resnet_memory': (ours, torch, peak), 'cnn_memory': (cnn, torch_cnn, peak),
        'bf16_speedup_short': (bf16, ours, short), 'bf16_speedup': (bf16, ours, steady),
        'bf16_vs_pytorch_short': (bf16, torch_bf16, short),
        'bf16_vs_pytorch': (bf16, torch_bf16, steady), 'bf16_memory': (bf16, torch_bf16, peak),
        'pipeline': ('pipeline/ours', 'pipeline/book', steady)}


def _end_to_end(results):
    """The figures of the end-to-end runs: ``e2e_time`` and ``e2e_accuracy``."""
    e2e_ours = [r for r in results.get('e2e/ours', []) if 'epoch_seconds' in r]
    e2e_book = [r for r in results.get('e2e/book', []) if 'epoch_seconds' in r]

    def e2e_time(rs):
        return statistics.median(statistics.mean(r['epoch_seconds']) for r in rs) if rs else None
    acc_gap = (abs(statistics.median(r['test_acc'] for r in e2e_ours)
                   - statistics.median(r['test_acc'] for r in e2e_book)) * 100
               if e2e_ours and e2e_book else None)
    return {'e2e_time': (e2e_time(e2e_book), e2e_time(e2e_ours),
                         _ratio(e2e_time(e2e_ours), e2e_time(e2e_book))),
            'e2e_accuracy': (median_of(e2e_book, 'test_acc'), median_of(e2e_ours, 'test_acc'),
                             acc_gap)}


def figures(results, flops_per_image, target_batch=TARGET_BATCH, book_batch=BOOK_BATCH):
    """The aims' figures from the medians: key -> (reference, ours, measured)."""
    def med(key, field='images_per_sec'):
        return median_of(results.get(key, []), field)
    found = {}
    for key, (num, den, field) in pairs(target_batch, book_batch).items():
        found[key] = (med(den, field), med(num, field), _ratio(med(num, field), med(den, field)))
    ours = f'train/resnet18/2/device/{target_batch}/ours'
    for key, speed, gemm in (
            ('flop_efficiency', med(ours), max(filter(None, (med('gemm/1', 'gflops'),
                                                             med('gemm/2', 'gflops'))),
                                               default=None)),
            ('bf16_flop_efficiency', med(ours + '/bfloat16'), med('gemm/bfloat16', 'gflops'))):
        achieved = speed * flops_per_image / 1e9 if speed else None
        found[key] = (gemm, achieved, _ratio(achieved, gemm))
    found['memory_growth'] = (med('memory/book', 'growth'), med('memory/ours', 'growth'),
                              med('memory/ours', 'growth'))
    return {**found, **_end_to_end(results)}


def paired_ratios(results, target_batch=TARGET_BATCH, book_batch=BOOK_BATCH):
    """key -> ``paired.Ratio`` of the aims comparing two measurements (``pairs``), round ``i``
    with round ``i`` (the ``i``-th results), where both have the figure."""
    from gluon_multigpu.study.paired import ratio_of  # pylint: disable=import-outside-toplevel
    found = {}
    for key, (num, den, field) in pairs(target_batch, book_batch).items():
        both = [(a[field], b[field]) for a, b in zip(results.get(num, []), results.get(den, []))
                if a.get(field) and b.get(field)]
        found[key] = ratio_of(*zip(*both)) if both else None
    return found


def summarize(results, flops_per_image, target_batch=TARGET_BATCH, book_batch=BOOK_BATCH):
    """Compute the aims' figures from the medians (``figures``); return a list of row dicts.

    ``results``: measurement key -> list of result dicts (one a round);
    ``target_batch``: the global batch of the training-speed aims. ``low``/``high``:
    the 95% interval of an aim's paired ratio (``paired_ratios``), ``sure``:
    whether the aim's threshold is outside it (None without an interval).
    """
    found = figures(results, flops_per_image, target_batch, book_batch)
    intervals = paired_ratios(results, target_batch, book_batch)
    rows = []
    for key, what, op, threshold in TARGETS:
        base, value, measured = found[key]
        met = None if measured is None else (measured >= threshold if op == '>=' else
                                             measured <= threshold)
        ratio = intervals.get(key)
        low, high = (ratio.low, ratio.high) if ratio is not None else (None, None)
        sure = None if low is None else not low <= threshold <= high
        rows.append({'key': key, 'what': what, 'reference': base, 'ours': value,
                     'measured': measured, 'target': f'{op} {threshold:g}', 'met': met,
                     'low': low, 'high': high, 'sure': sure})
    return rows


def torch_missing(results):
    """Whether PyTorch is missing: no ``torch`` to import, or a measurement found none."""
    return (importlib.util.find_spec('torch') is None
            or any(r.get('torch_missing') for runs in results.values() for r in runs))


def fmt(x, digits=3):
    if x is None:
        return 'n/a'
    return f'{x:.{digits}g}' if abs(x) < 1000 else f'{x:,.0f}'


def table(rows, no_torch=False):
    """Return the Markdown table of the aims; ``no_torch``: a line under it says how to add
    PyTorch, whose rows are n/a."""
    lines = ['| aim | reference | ours | measured | aim | met |',
             '| --- | ---: | ---: | ---: | :---: | :---: |']
    for r in rows:
        met = 'n/a' if r['met'] is None else ('yes' if r['met'] else 'NO')
        if r.get('sure') is False:
            met += ' (inside the noise)'
        measured = fmt(r['measured'])
        if r.get('low') is not None:
            measured += f" ({fmt(r['low'])}-{fmt(r['high'])})"
        lines.append(f"| {r['what']} | {fmt(r['reference'])} | {fmt(r['ours'])} | "
                     f"{measured} | {r['target']} | {met} |")
    if no_torch:
        lines.append(f'\nPyTorch is not installed, so the rows against it are n/a: install it '
                     f'with {INSTALL_TORCH}')
    return '\n'.join(lines)


def detail_table(results):
    """Return the Markdown table of every measurement's median."""
    lines = ['| measurement | median | runs |', '| --- | ---: | ---: |']
    for key, runs in results.items():
        fields = [f for f in ('images_per_sec', 'short_images_per_sec', 'startup_s', 'gflops',
                              'growth', 'peak_mb', 'test_acc')
                  if median_of(runs, f) is not None]
        if key.startswith('e2e/'):
            value = ', '.join(f"{statistics.mean(r['epoch_seconds']):.1f} s/epoch, acc "
                              f"{r['test_acc']:.3f}" for r in runs if 'epoch_seconds' in r)
        else:
            value = ', '.join(f'{f} {fmt(median_of(runs, f))}' for f in fields)
        errors = [r['error'] for r in runs if 'error' in r]
        lines.append(f"| {key} | {value or errors[0] if errors else value} | {len(runs)} |")
    return '\n'.join(lines)



"""Comparisons that survive a changing load: variants measured in turn, judged by paired ratios.

A shared machine's load changes while a comparison runs; measured one after
the other, two variants meet different loads and the drift reads as a winner.
So variants are measured in rounds (round 1 of each, then round 2 of each, ...)
and judged by the ratios of their figures within a round. ``Paired`` holds
every round's figures and load and answers, for each variant against the
fastest: slower (the interval excludes 1 and the median differs by
``min_effect`` or more), equally fast (the whole interval within
1 +- ``min_effect``) or cannot tell. The ratio is the median of the per-round
ratios, its interval the 95% t-interval of their geometric mean. The first
round (it warms the process) and rounds whose variants met different loads
are left out where two rounds remain; ``LoadMeter`` records each round's load.
"""
import contextlib
import math
import os
import statistics
import time

__all__ = ['t_quantile', 'Ratio', 'ratio_of', 'LoadMeter', 'load_changed', 'load_heavy',
           'load_note', 'Paired', 'MIN_EFFECT', 'CONFIDENCE']

#: The smallest difference named, and the band around 1 (0.97-1.03) an "equally fast" interval
#: lies within.
MIN_EFFECT = 0.03
#: The intervals' confidence.
CONFIDENCE = 0.95
#: The 97.5% quantiles of Student's t for 1..30 degrees of freedom (two-sided 95%).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
#: A change of load the answer reports: other processes' CPU use changing by half a core or more
#: (where a system does not say, the one-minute load average changing by one or more).
LOAD_CHANGE_CORES, LOAD_CHANGE_AVERAGE = 0.5, 1.0
#: A heavy load: other processes using this share of the machine's cores or more.
HEAVY_SHARE = 0.5


def t_quantile(df):
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (``df`` >= 1).

    A table up to 30, then the Cornish-Fisher expansion about the normal's
    1.95996 (within 1e-4 from there on).
    """
    if df < 1:
        raise ValueError(f'degrees of freedom must be 1 or more, got {df}')
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


class Ratio:
    """The paired ratio of two variants' figures: per round, its median, its interval.

    ``values``: one ratio per round (A's figure over B's, both "lower is
    better", e.g. seconds); ``rounds``: how many. ``low``/``high``: the 95%
    interval of their geometric mean, None with one round.
    """

    def __init__(self, values):
        self.values = list(values)
        self.median, self.rounds = statistics.median(self.values), len(self.values)
        self.low = self.high = None
        if self.rounds > 1:
            logs = [math.log(v) for v in self.values]
            half = t_quantile(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
            centre = statistics.fmean(logs)
            self.low, self.high = math.exp(centre - half), math.exp(centre + half)

    def differs(self, min_effect=MIN_EFFECT):
        """Whether A and B differ: the interval excludes 1 and the median is ``min_effect`` or
        more from it. With one round (no interval): never."""
        beyond = self.median >= 1 + min_effect or self.median <= 1 / (1 + min_effect)
        return self.low is not None and beyond and (self.low > 1 or self.high < 1)

    def equal(self, min_effect=MIN_EFFECT):
        """Whether A and B are equally fast: the whole interval within ``1 - min_effect`` to
        ``1 + min_effect``. With one round (no interval): never."""
        return self.low is not None and 1 - min_effect <= self.low and self.high <= 1 + min_effect

    def verdict(self, min_effect=MIN_EFFECT):
        """``'slower'`` or ``'faster'`` (A against B), ``'equal'`` or ``'cannot tell'``."""
        if self.differs(min_effect):
            return 'slower' if self.median > 1 else 'faster'
        return 'equal' if self.equal(min_effect) else 'cannot tell'

    def describe(self):
        """``1.35x (95% interval 1.30-1.41, 3 rounds)``."""
        if self.low is None:
            return f'{self.median:.2f}x (1 round: no interval)'
        return (f'{self.median:.2f}x ({CONFIDENCE:.0%} interval {self.low:.2f}-{self.high:.2f}, '
                f'{self.rounds} rounds)')

    def to_dict(self):
        """The figures, for a results file."""
        return {'median': self.median, 'low': self.low, 'high': self.high,
                'rounds': self.rounds, 'per_round': self.values}


def ratio_of(a, b):
    """The ``Ratio`` of paired figures ``a[i] / b[i]`` (lists of one figure per round)."""
    if len(a) != len(b) or not a:
        raise ValueError(f'paired figures need one per round on both sides, got {len(a)} and '
                         f'{len(b)}')
    return Ratio(x / y for x, y in zip(a, b))


def _cpu_jiffies():
    """``(busy, steal, total)`` jiffies of all CPUs from /proc/stat, or None elsewhere."""
    with contextlib.suppress(OSError, ValueError), open('/proc/stat', encoding='ascii') as f:
        fields = [int(v) for v in f.readline().split()[1:]]
        user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        return user + nice + system + irq + softirq, steal, user + nice + system + idle + \
            iowait + irq + softirq + steal
    return None


def _own_cpu():
    """CPU seconds this process has used (every thread), and its children that have ended
    (the measured runs of a program that measures in fresh processes)."""
    return sum(os.times()[:4])  # user, system, and the ended children's user and system


class LoadMeter:
    """What else the machine did during a round: ``start()``, then ``stop()`` returns a dict.

    ``load``: the one-minute load average at the round's end; ``others``:
    the CPU time processes other than this one and the children it waited for
    took during the round, in cores (1.0: one core busy throughout); ``steal``: the share of CPU time
    the hypervisor gave to other machines; ``cores``: the machine's. A figure a system does
    not give is None, and so are the CPU figures of a round under a quarter of a second (the
    kernel counts in 10 ms ticks).
    """

    def start(self):
        """Begin a round."""
        self._start = (time.monotonic(), _cpu_jiffies(), _own_cpu())

    def stop(self):
        """End the round: ``{'load': ..., 'others': ..., 'steal': ..., 'cores': ...}``."""
        began, jiffies, own = self._start
        wall, now = max(time.monotonic() - began, 1e-6), _cpu_jiffies()  # the round's end
        others = steal = None
        # The kernel counts CPU time in ticks (10 ms): a round much shorter than a quarter of a
        # second gives no figure worth the name.
        if jiffies is not None and now is not None and wall >= 0.25:
            busy = (now[0] - jiffies[0]) / os.sysconf('SC_CLK_TCK')
            others = max(0.0, busy - (_own_cpu() - own)) / wall
            total = now[2] - jiffies[2]
            steal = (now[1] - jiffies[1]) / total if total > 0 else 0.0
        load = None
        with contextlib.suppress(OSError):  # no load average here
            load = os.getloadavg()[0]
        return {'load': load, 'others': others, 'steal': steal, 'cores': os.cpu_count()}


def _span(loads, key):
    values = [l[key] for l in loads if l and l.get(key) is not None]
    return (min(values), max(values)) if values else None


def load_changed(loads):
    """Whether the load changed during the rounds (``LoadMeter.stop`` dicts).

    Judged by the CPU other processes took, which a round measures as it
    runs; the load average counts this process too and follows a change only
    over a minute (a run's own start raises it), so it decides only where the
    other figure is missing.
    """
    others, average = _span(loads, 'others'), _span(loads, 'load')
    if others:
        return others[1] - others[0] >= LOAD_CHANGE_CORES
    return bool(average and average[1] - average[0] >= LOAD_CHANGE_AVERAGE)


def load_heavy(loads):
    """Whether other processes used ``HEAVY_SHARE`` of the cores or more in any round."""
    others = _span(loads, 'others')
    cores = max((l.get('cores') or 0 for l in loads if l), default=0)
    return bool(others and cores and others[1] >= HEAVY_SHARE * cores)


def load_note(loads):
    """A sentence on the load during the rounds: heavy, changed or light, and the steal time."""
    others, average, steal = (_span(loads, k) for k in ('others', 'load', 'steal'))
    if not (others or average):
        return ''
    cores = max((l.get('cores') or 0 for l in loads if l), default=0)
    parts = [f'other processes used {others[0]:.1f} to {others[1]:.1f} '
             + (f'of the {cores} cores' if cores else 'cores')] if others else []
    if average:
        parts.append(f'load average {average[0]:.1f} to {average[1]:.1f}, this run included')
    if steal and steal[1] >= 0.01:
        parts.append(f'up to {steal[1]:.0%} of the CPU time stolen by the hypervisor')
    if load_heavy(loads):
        return ('the load was heavy (' + ', '.join(parts) + '): figures measured beside it are '
                'unreliable')
    if load_changed(loads):
        return ('the load changed during the run (' + ', '.join(parts) + '); each ratio is of '
                'rounds measured side by side, so the change fell on both sides of most of them')
    return f'the load {"was light" if cores else "did not change"} (' + ', '.join(parts) + ')'


class Paired:
    """The figures of several variants measured in rounds, and the answer they give.

    Parameters
    ----------
    names : list of str
        The variants, in the order each round measures them.
    higher_is_better : bool
        The figures are rates (images/s) rather than times (seconds).
    min_effect : float
        The smallest relative difference named, a fraction (``MIN_EFFECT``: 0.03).
    warmup : int
        Rounds left out of the ratios where later ones exist: the process's first round is
        not like the others (oneDNN compiles its kernels for the first network that needs
        them; memory pools grow), and it would tell against whichever variant came first.
    """

    def __init__(self, names, higher_is_better=False, min_effect=MIN_EFFECT, warmup=1):
        self.names, self.higher_is_better = list(names), higher_is_better
        self.min_effect, self.warmup = min_effect, warmup
        # name -> {round: figure}, and {round: its load}
        self.figures, self.loads = {n: {} for n in self.names}, {n: {} for n in self.names}

    def add(self, name, round_, figure, load=None):
        """Round ``round_`` of variant ``name`` measured ``figure`` (``load``: LoadMeter's)."""
        self.figures[name][round_], self.loads[name][round_] = figure, load

    def rounds(self, names=None):
        """The rounds judged: those every variant of ``names`` (default: all) has a figure for,
        in order, without the first ``warmup`` of the run where later ones exist, and without
        the rounds whose variants met different loads (``uneven``) where two others remain."""
        names = names or self.names
        common = sorted(set.intersection(*(set(self.figures[n]) for n in names)))
        # the run's first round (None: no round at all, so none in common either)
        first = min((r for n in self.names for r in self.figures[n]), default=None)
        judged = [r for r in common if r >= first + self.warmup] or common
        even = [r for r in judged if not self.uneven(r, names)]
        return even if len(even) >= 2 else judged

    def uneven(self, round_, names=None):
        """Whether the variants of ``names`` met different loads in ``round_``: the CPU other
        processes took during their measurements differs by ``LOAD_CHANGE_CORES`` or more (a
        load that came or went within the round, which tells against one side of its ratio)."""
        others = _span([self.loads[n].get(round_) for n in names or self.names], 'others')
        return bool(others) and others[1] - others[0] >= LOAD_CHANGE_CORES

    def set_aside(self, names=None):
        """How many rounds ``rounds`` left out because their variants met different loads."""
        names = names or self.names
        kept = set(self.rounds(names))
        return sum(1 for r in set.intersection(*(set(self.figures[n]) for n in names))
                   if r not in kept and self.uneven(r, names))

    def _times(self, name, rounds):
        values = [self.figures[name][r] for r in rounds]
        return [1 / v for v in values] if self.higher_is_better else values

    def ratio(self, a, b):
        """The ``Ratio`` of ``a``'s time to ``b``'s (above 1: ``a`` is slower), over the rounds
        both have; None when they share none."""
        rounds = self.rounds([a, b])
        return ratio_of(self._times(a, rounds), self._times(b, rounds)) if rounds else None

    def all_loads(self):
        """Every round's load, of every variant."""
        return [l for n in self.names for l in self.loads[n].values() if l]

    def fastest(self):
        """The variant of lowest median time over the rounds judged (None before one round), the
        one ``answer`` and ``ratio`` tables compare the others with."""
        names = [n for n in self.names if self.figures[n]]
        rounds = self.rounds(names) if names else []
        return min(names, key=lambda n: statistics.median(self._times(n, rounds))) if rounds \
            else None

    def answer(self, noun='', where=''):
        """The answer in one sentence: each variant against the fastest, in three words.

        Slower (with how much), equally fast, or cannot tell at this load (with
        what would tell), each with its ratio and interval; the load during the
        run follows. ``noun`` goes before each name (``kvstore``), ``where``
        before the answer (``on 2 devices``).
        """
        label = (lambda n: f'{noun} {n}') if noun else (lambda n: n)
        names = [n for n in self.names if self.figures[n]]
        lead = f'{where}, ' if where else ''
        if len(names) < 2:
            return (f'{lead}only {label(names[0])} was measured: nothing to compare.'
                    if names else 'nothing was measured.')
        if not (rounds := self.rounds(names)):
            return f'{lead}no round measured every variant: nothing to compare yet.'
        best = self.fastest()
        if len(rounds) < 2:
            answer = (f'{label(best)} was fastest in the one round judged, which cannot '
                      'tell a difference from noise (the first round warms the process and is '
                      'judged only alone): measure 3 or more rounds')
        else:
            answer = self._verdicts(best, [(n, self.ratio(n, best)) for n in names if n != best],
                                    label, noun)
        note = load_note(self.all_loads())
        if aside := self.set_aside(names):
            note += (f'{"; " if note else ""}{aside} round{"s" if aside > 1 else ""} set aside: '
                     'the variants met different loads in it (other processes\' CPU differed '
                     f'by {LOAD_CHANGE_CORES:g} cores or more)')
        return f'{lead}{answer}{"; " + note if note else ""}.'

    def _verdicts(self, best, others, label, noun):
        """The clauses of ``answer`` for ``others`` (``(name, Ratio)`` against ``best``)."""
        e = self.min_effect
        band = f'{1 - e:.2f}-{1 + e:.2f}'
        verdicts = {n: r.verdict(e) for n, r in others}
        equal = [n for n, _ in others if verdicts[n] == 'equal']
        unsure = [(n, r) for n, r in others if verdicts[n] == 'cannot tell']
        clear = not equal and not unsure
        clauses = [f'{label(best)} is fastest'] if clear else []
        if equal:
            *listed, last = [best] + equal
            within = '; '.join(f'{n} vs {best} {r.describe()}' for n, r in others if n in equal)
            clauses.append(f'{noun + "s " if noun else ""}{", ".join(listed)} and {last} are '
                           f'equally fast ({within}: the whole interval within {band})')
        than = '' if clear else f' than {label(best)}'
        clauses += [f'{label(n)} takes {abs(r.median - 1):.0%} '
                    f'{"longer" if r.median > 1 else "less time"}{than} ({r.describe()})'
                    for n, r in others if verdicts[n] in ('slower', 'faster')]
        for n, r in unsure:
            why = ('the interval includes 1 and' if r.low <= 1 <= r.high else
                   f'the difference is under {e:.0%} but the interval')
            clauses.append(f'cannot tell at this load whether {label(best)} or {label(n)} is '
                           f'faster ({n} vs {best} {r.describe()}: {why} reaches beyond {band})')
        if unsure:
            clauses.append('a quieter machine would tell' if load_heavy(self.all_loads()) else
                           'more rounds would tell, each narrowing the interval')
        return '; '.join(clauses)

    def to_dict(self):
        """Every round's figure and load, and each variant's ratio to the first, for a results
        file."""
        ratios = {n: self.ratio(n, self.names[0]) for n in self.names[1:]}
        return {'variants': self.names, 'higher_is_better': self.higher_is_better,
                'min_effect': self.min_effect,
                'rounds': {n: [{'round': r, 'figure': f, 'load': self.loads[n].get(r)}
                               for r, f in sorted(self.figures[n].items())] for n in self.names},
                'ratio_to_first': {n: r.to_dict() if r else None for n, r in ratios.items()},
                'load_changed': load_changed(self.all_loads())}



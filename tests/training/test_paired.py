"""Paired comparisons (study/paired.py): the interval, the verdict, the load, and runs in turn."""
import math
import subprocess
import sys
import time
import types

import numpy as onp
import pytest

from gluon_multigpu.runs.comparison import Comparison
from gluon_multigpu.section.results import EpochRecord, TrainResult
from gluon_multigpu.study import paired
from gluon_multigpu.study.compare import ParamTracker


def t_cdf(q, df, points=200_001):
    """Student's t CDF at ``q`` by Simpson's rule over its density (independent of the table)."""
    if df == 1:
        return 0.5 + math.atan(q) / math.pi
    x = onp.linspace(0.0, q, points)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    pdf = onp.exp(log_c - (df + 1) / 2 * onp.log1p(x * x / df))
    h = x[1] - x[0]
    return 0.5 + h / 3 * (pdf[0] + pdf[-1] + 4 * pdf[1:-1:2].sum() + 2 * pdf[2:-1:2].sum())


@pytest.mark.parametrize('df', [1, 2, 3, 4, 7, 12, 30, 31, 45, 200])
def test_the_t_quantile_leaves_two_and_a_half_percent_above_it(df):
    assert t_cdf(paired.t_quantile(df), df) == pytest.approx(0.975, abs=1e-4)


def test_a_ratio_is_the_median_with_the_t_interval_of_the_geometric_mean():
    a, b = [1.30, 1.41, 1.35, 1.38], [1.0, 1.02, 0.99, 1.01]
    r = paired.ratio_of(a, b)
    ratios = onp.array(a) / onp.array(b)
    logs = onp.log(ratios)
    half = 3.182 * logs.std(ddof=1) / onp.sqrt(4)  # t(0.975, 3 df), from any table
    assert r.median == pytest.approx(onp.median(ratios))
    assert (r.low, r.high) == pytest.approx((onp.exp(logs.mean() - half),
                                             onp.exp(logs.mean() + half)))
    assert r.differs() and r.describe().startswith('1.36x (95% interval 1.3')
    one = paired.ratio_of([2.0], [1.0])
    assert one.low is None and not one.differs() and 'no interval' in one.describe()
    with pytest.raises(ValueError):
        paired.ratio_of([1.0], [1.0, 2.0])


def test_no_difference_is_named_inside_the_interval_or_under_the_minimum_effect():
    wide = paired.Ratio([0.9, 1.2, 1.1])  # the interval includes 1
    assert wide.low < 1 < wide.high and not wide.differs()
    small = paired.Ratio([1.02, 1.021, 1.019])  # beyond 1, but only by 2%
    assert small.low > 1 and not small.differs(0.03) and small.differs(0.01)
    faster = paired.Ratio([0.5, 0.52, 0.49])
    assert faster.high < 1 and faster.differs()


def test_a_ratio_is_slower_equal_or_cannot_tell():
    """Equal takes the whole interval within 0.97-1.03; an interval that includes 1 but
    reaches beyond is not equal: the run cannot tell."""
    assert paired.Ratio([1.30, 1.41, 1.35, 1.38]).verdict() == 'slower'
    assert paired.Ratio([0.5, 0.52, 0.49]).verdict() == 'faster'
    same = paired.Ratio([1.0, 1.01, 0.99, 1.005])
    assert 0.97 <= same.low and same.high <= 1.03 and same.verdict() == 'equal'
    wide = paired.Ratio([0.82, 1.61, 1.19])  # the mission's interval: 1 inside, but so is 1.5
    assert wide.low < 1 < wide.high and not wide.equal() and wide.verdict() == 'cannot tell'
    small = paired.Ratio([1.02, 1.021, 1.019])  # beyond 1 by 2%, inside the band: equal
    assert small.equal() and small.verdict() == 'equal'
    edge = paired.Ratio([1.0, 1.04, 1.02])  # under 3%, but the interval reaches past 1.03
    assert edge.high > 1.03 and edge.verdict() == 'cannot tell'
    assert paired.Ratio([1.0]).verdict() == 'cannot tell'  # one round: no interval


def paired_of(figures, **kwargs):
    p = paired.Paired(list(figures), **kwargs)
    for name, values in figures.items():
        for r, v in enumerate(values, 1):
            p.add(name, r, v)
    return p


def test_the_answer_names_a_slower_variant_with_its_interval():
    p = paired_of({'local': [9.0, 2.0, 2.1, 1.9, 2.0], 'device': [3.0, 3.0, 3.1, 2.9, 3.05]})
    answer = p.answer('kvstore', 'on 2 devices')
    assert answer.startswith('on 2 devices, kvstore local is fastest; kvstore device takes 51% '
                             'longer (1.51x (95% interval 1.4'), answer
    assert p.rounds() == [2, 3, 4, 5]  # round 1 warms the process: left out
    # Equal variants with a load that doubles halfway through: each round's pair sees it alike.
    drift = paired_of({'a': [1.0, 1.0, 1.01, 2.0, 2.02, 1.99], 'b': [1.0, 1.01, 1.0, 2.01, 2.0, 2.0]})
    assert ' are equally fast (a vs b ' in drift.answer() or ' are equally fast (b vs a ' in \
        drift.answer()
    assert drift.answer().endswith('the whole interval within 0.97-1.03).')
    # The same figures measured one variant after the other: a looks twice as fast.
    sequential = paired_of({'a': [1.0, 1.0, 1.01], 'b': [2.01, 2.0, 2.0]})
    assert 'takes 99% longer' in sequential.answer()


def test_an_interval_that_includes_1_and_reaches_beyond_the_band_cannot_tell():
    """The mission's case: device vs local 1.19x, interval 0.8-1.6 is no evidence of equal
    speed; the answer says this run cannot tell, and what would tell."""
    figures = {'local': [9.0, 1.0, 1.0, 1.0], 'device': [9.0, 0.82, 1.61, 1.19]}
    answer = paired_of(figures).answer('kvstore', 'on 2 devices')
    assert answer.startswith('on 2 devices, cannot tell at this load whether kvstore local or '
                             'kvstore device is faster (device vs local 1.19x (95% interval 0.'), \
        answer
    assert 'equally fast' not in answer and 'fastest' not in answer
    assert answer.endswith(': the interval includes 1 and reaches beyond 0.97-1.03); more rounds '
                           'would tell, each narrowing the interval.'), answer
    # Beside a heavy load, a quieter machine would tell, and the figures are called unreliable.
    p = paired.Paired(list(figures))
    heavy = {'load': 3.0, 'others': 1.8, 'steal': 0.0, 'cores': 2}
    for name, values in figures.items():
        for r, v in enumerate(values, 1):
            p.add(name, r, v, heavy)
    answer = p.answer('kvstore')
    assert '; a quieter machine would tell; the load was heavy (other processes used 1.8 to 1.8 ' \
        'of the 2 cores' in answer, answer
    assert answer.endswith('): figures measured beside it are unreliable.'), answer
    # Three variants: each one's own verdict against the fastest.
    three = paired_of(dict(figures, none=[9.0, 1.3, 1.31, 1.29]))
    assert 'kvstore none takes 30% longer than kvstore local (1.30x' in three.answer('kvstore')
    assert 'whether kvstore local or kvstore device is faster' in three.answer('kvstore')


def test_one_round_judged_or_one_variant_names_no_winner():
    two = paired_of({'local': [1.0, 1.05], 'device': [1.0, 1.0]})
    assert two.answer('kvstore') == (
        'kvstore device was fastest in the one round judged, which cannot tell a difference '
        'from noise (the first round warms the process and is judged only alone): measure 3 or '
        'more rounds; kvstore local takes 5% longer (1.05x (1 round: no interval)).'.replace(
            '; kvstore local takes 5% longer (1.05x (1 round: no interval))', ''))
    assert paired_of({'local': [1.0]}).answer('kvstore') == \
        'only kvstore local was measured: nothing to compare.'


def test_rates_are_compared_as_their_inverse():
    p = paired_of({'even': [100, 100, 102, 98], 'auto': [150, 151, 149, 150]},
                  higher_is_better=True)
    assert p.answer().startswith('auto is fastest; even takes 51% longer (1.51x (95% interval 1.4')
    assert p.ratio('even', 'auto').median == pytest.approx(1.5, rel=0.02)


def test_the_load_note_says_when_the_load_changed():
    light = [{'load': 1.0, 'others': 0.1, 'steal': 0.0, 'cores': 2},
             {'load': 1.2, 'others': 0.2, 'steal': 0.0, 'cores': 2}]
    assert not paired.load_changed(light) and not paired.load_heavy(light)
    assert paired.load_note(light) == ('the load was light (other processes used 0.1 to 0.2 of '
                                       'the 2 cores, load average 1.0 to 1.2, this run included)')
    rising = light + [{'load': 1.4, 'others': 0.9, 'steal': 0.05, 'cores': 2}]
    assert paired.load_changed(rising) and not paired.load_heavy(rising)
    note = paired.load_note(rising)
    assert note.startswith('the load changed during the run (other processes used 0.1 to 0.9 '
                           'of the 2 cores, load average 1.0 to 1.4, this run included, up to 5% '
                           'of the CPU time stolen')
    # Half the cores or more: heavy, whether or not it changed, and the figures unreliable.
    heavy = light + [{'load': 2.0, 'others': 1.0, 'steal': 0.0, 'cores': 2}]
    assert paired.load_heavy(heavy) and not paired.load_heavy(heavy[:2] + [dict(heavy[2],
                                                                                 cores=4)])
    assert paired.load_note(heavy) == ('the load was heavy (other processes used 0.1 to 1.0 of '
                                       'the 2 cores, load average 1.0 to 2.0, this run '
                                       'included): figures measured beside it are unreliable')
    # Without the machine's cores (an older record), no judgement of the share.
    assert paired.load_note([dict(l, cores=None) for l in light]).startswith(
        'the load did not change (other processes used 0.1 to 0.2 cores,')
    # The load average follows this run's own start: it decides only without the CPU figures.
    own = [{'load': 0.2, 'others': 0.0}, {'load': 1.9, 'others': 0.1}]
    assert not paired.load_changed(own)
    assert paired.load_changed([{'load': 0.2, 'others': None}, {'load': 1.9, 'others': None}])
    assert paired.load_note([None, {'load': None, 'others': None, 'steal': None}]) == ''


@pytest.mark.xdist_group('timing')  # conftest.TIMING: measures the CPU others take
def test_the_load_meter_sees_another_process_busy_and_not_this_one():
    meter = paired.LoadMeter()
    busy = subprocess.Popen([sys.executable, '-c', 'print("busy", flush=True)\nwhile True: pass'],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline() == 'busy\n'  # it runs: the round begins
        meter.start()
        time.sleep(1.0)
        load = meter.stop()
    finally:
        busy.kill()
        busy.wait()
    assert load['others'] >= 0.5 and 0 <= load['steal'] <= 1 and load['load'] >= 0
    assert load['cores'] >= 1
    meter.start()
    end = time.process_time() + 0.5
    while time.process_time() < end:  # this process busy: not others' time
        pass
    mine = meter.stop()
    assert mine['others'] is not None and mine['others'] < load['others'] + 1


class Work:
    """A run of a comparison that does fixed work per epoch (and sleeps ``extra`` more).

    With ``clock``, an epoch's seconds are ``clock()``'s instead: a machine
    whose load is known.
    """

    def __init__(self, name, extra=0.0, work=300_000, clock=None):
        self.name, self.extra, self.work, self.clock = name, extra, work, clock
        self.result = None

    def train(self, epochs):
        if self.result is None:
            self.result = TrainResult(devices=['cpu(0)'], kvstore=self.name, lr=0.1)
        for _ in range(epochs):
            tic = time.perf_counter()
            if self.clock is None:
                sum(i * i for i in range(self.work))
                time.sleep(self.extra)
            seconds = self.clock() if self.clock else time.perf_counter() - tic
            self.result.epochs.append(EpochRecord(len(self.result.epochs) + 1, 1.0, 0.5, 0.5,
                                                  seconds, 0.0, 100))
        return self.result


def compare(runs, rounds):
    config = types.SimpleNamespace(kvstore=list(runs), num_epochs=rounds, plot=None, json=None,
                                   report=None)
    out = []
    stream = types.SimpleNamespace(write=out.append, flush=lambda: None)
    comparison = Comparison(config, None, ParamTracker(compare=False), stream)
    comparison.run(lambda name, schedule: runs[name], quiet=True)
    return ''.join(out).splitlines()[-1], comparison


@pytest.mark.xdist_group('timing')  # conftest.TIMING
def test_a_variant_made_slower_by_a_known_amount_is_named():
    """device sleeps six times as long as its work takes: about 7 times local's time, on a
    real clock and whatever else the machine does (a load would have to slow one of local's
    epochs sevenfold, and not device's, to turn a round around; with three times, a suite
    on two cores at a load average of 6.5 slowed one round enough to widen the interval
    past 1)."""
    work = 1_000_000
    probe = Work('probe', work=work).train(1).epochs[0].seconds  # the work's time here now
    answer, comparison = compare({'local': Work('local', work=work),
                                  'device': Work('device', 6 * probe, work=work)}, 6)
    assert ', kvstore local is fastest; kvstore device takes ' in answer, answer
    assert comparison.loads['device'].keys() == {1, 2, 3, 4, 5, 6}
    assert [r.kvstore for r in comparison.results] == ['local', 'device']


def test_each_closing_line_names_its_kvstore_and_a_single_runs_line_is_the_books():
    def lines(names):
        config = types.SimpleNamespace(kvstore=names, num_epochs=3, plot=None, json=None,
                                       report=None)
        out = []
        stream = types.SimpleNamespace(write=out.append, flush=lambda: None)
        runs = {n: Work(n, clock=lambda: 2.0) for n in names}
        Comparison(config, None, ParamTracker(compare=False), stream).run(
            lambda name, schedule: runs[name])
        return [l for l in ''.join(out).splitlines() if l.startswith('test acc: ')]
    assert lines(['local']) == ['test acc: 0.50, 2.0 sec/epoch on [cpu(0)]']
    assert lines(['local', 'device']) == ['test acc: 0.50, 2.0 sec/epoch on [cpu(0)] with kvstore '
                                          f'{k}' for k in ('local', 'device')]


def test_equal_variants_with_a_load_that_changes_halfway_are_equally_fast():
    """Every epoch costs 1 s, 2 s from the 7th of 12 on (round 4 of 6): a load that doubles.

    Taken in turn, every round but none sees the change on both sides; one after the other,
    the same machine names the second run slower.
    """
    units = []

    def clock():
        units.append(1)
        return 1.0 if len(units) <= 6 else 2.0
    answer, comparison = compare({'local': Work('local', clock=clock),
                                  'device': Work('device', clock=clock)}, 6)
    assert answer.startswith('on 1 device, kvstores ') and ' are equally fast (' in answer, answer
    units.clear()
    sequential = paired_of({'local': [clock() for _ in range(6)],
                            'device': [clock() for _ in range(6)]})
    assert sequential.answer().startswith('local is fastest; device takes 100% longer')


def test_a_shifting_load_within_rounds_still_names_the_slower_variant():
    """device costs 1.5 times local's; the load doubles from round 3 and halves again in 5."""
    units = []

    def clock(cost):
        def seconds():
            units.append(1)
            n = len(units)
            return cost * (2.0 if 5 <= n <= 8 else 1.0)
        return seconds
    answer, _ = compare({'local': Work('local', clock=clock(1.0)),
                         'device': Work('device', clock=clock(1.5))}, 6)
    assert ', kvstore local is fastest; kvstore device takes 50% longer (1.50x (95% interval' \
        in answer, answer


def test_a_child_waited_for_is_this_runs_own_time_not_others():
    """inflight measures in fresh processes: their CPU time, once waited for, is the run's."""
    before = paired._own_cpu()
    subprocess.run([sys.executable, '-c', 'import time\nend = time.process_time() + 0.5\n'
                    'while time.process_time() < end: pass'], check=True)
    assert paired._own_cpu() - before >= 0.45


def test_a_round_whose_variants_met_different_loads_is_set_aside():
    """device is 1.3 times local's time; in round 4 the load arrived between local's epoch and
    device's (other processes: 0.0 and 1.5 cores), and device's epoch took twice as long again.
    Set aside, the other rounds name device slower; kept, they could not."""
    p = paired.Paired(['local', 'device'])
    quiet, busy = {'load': 1.0, 'others': 0.0, 'steal': 0.0}, {'load': 2.0, 'others': 1.5,
                                                              'steal': 0.0}
    seconds = {'local': [5, 1.0, 1.01, 1.0], 'device': [5, 1.3, 1.32, 2.6]}
    for name, values in seconds.items():
        for r, v in enumerate(values, 1):
            p.add(name, r, v, busy if (r, name) == (4, 'device') else quiet)
    assert p.uneven(4) and not p.uneven(3) and p.rounds() == [2, 3] and p.set_aside() == 1
    answer = p.answer('kvstore')
    assert answer.startswith('kvstore local is fastest; kvstore device takes 30% longer (1.30x '
                             '(95% interval 1.2'), answer
    assert answer.endswith('; 1 round set aside: the variants met different loads in it (other '
                           "processes' CPU differed by 0.5 cores or more).")
    kept = paired.ratio_of(seconds['device'][1:], seconds['local'][1:])
    assert not kept.differs()  # the same rounds, that one kept: no winner
    # Fewer than two rounds left: none is set aside.
    q = paired.Paired(['a', 'b'])
    for r, (la, lb) in enumerate([(quiet, quiet), (quiet, busy), (quiet, busy)], 1):
        q.add('a', r, 1.0, la)
        q.add('b', r, 1.0, lb)
    assert q.rounds() == [2, 3] and q.set_aside() == 0

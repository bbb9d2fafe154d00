"""A variant against a reference in paired rounds (``study.paired``): the verdict, and its words."""
from gluon_multigpu.study.paired import CONFIDENCE

__all__ = ['versus', 'describe_versus']


def versus(pairs, name, reference):
    """``name`` against ``reference`` in ``pairs`` (a ``Paired``), as a speed-up: a dict.

    ``ratio``: the median over the rounds both have of ``reference``'s time
    over ``name``'s (above 1: ``name`` is faster; for rates, ``name``'s rate
    over ``reference``'s); ``low``/``high``: its 95% interval (None with one
    round); ``verdict``: ``faster``, ``slower``, ``equally fast`` (the whole interval within
    1 +- ``min_effect``) or ``cannot tell`` (None for the reference itself or with no round in
    common); ``rounds``: how many.
    """
    r = pairs.ratio(reference, name)
    if r is None:
        return {'ratio': None, 'low': None, 'high': None, 'verdict': None, 'rounds': 0}
    verdict = None
    if name != reference:
        verdict = ('faster' if r.median > 1 else 'slower') if r.differs(pairs.min_effect) else \
            'equally fast' if r.equal(pairs.min_effect) else 'cannot tell'
    return {'ratio': r.median, 'low': r.low, 'high': r.high, 'verdict': verdict,
            'rounds': r.rounds}


def describe_versus(v, reference):
    """``1.35x (95% interval 1.30-1.41, 4 rounds): faster than float32``, from ``versus``."""
    if v['ratio'] is None:
        return f'not measured beside {reference}'
    interval = ('1 round: no interval' if v['low'] is None else
                f"{CONFIDENCE:.0%} interval {v['low']:.2f}-{v['high']:.2f}, {v['rounds']} rounds")
    verdict = {'faster': f'faster than {reference}', 'slower': f'slower than {reference}',
               'equally fast': f'as fast as {reference} (the whole interval within 3%)'}.get(
        v['verdict'], f'cannot tell against {reference} at this load (more rounds or a quieter '
                      'machine would tell)')
    return f"{v['ratio']:.2f}x ({interval}): {verdict}"

"""Comparing runs that differ only in their gradient-synchronisation back end.

Runs with the same seed, data order and learning rate should end every epoch
with the same parameters whatever the kvstore: the kvstores only decide
where the per-device gradients are summed. ``ParamTracker`` checks that
after every epoch (the largest absolute difference to the first run, and the
largest difference between the copies on the devices of one run), and
``recommend`` turns the timings into a sentence.
"""
import hashlib

import numpy as onp

__all__ = ['param_arrays', 'fingerprint', 'device_spread', 'ParamTracker', 'epoch_noise', 'recommend',
           'NOISE']

#: Relative differences in seconds per epoch below this are always treated as noise.
NOISE = 0.03


def param_arrays(net, ctx=None):
    """Return the parameters of ``net`` on ``ctx`` (default: their first device) as NumPy arrays."""
    return [p.data(ctx or p.list_ctx()[0]).asnumpy() for p in net.collect_params().values()]


def fingerprint(net):
    """The first 12 hex digits of the SHA-256 of every parameter on its first device.

    Equal fingerprints mean bit-identical parameters (sync point: reads them all).
    """
    digest = hashlib.sha256()
    for array in param_arrays(net):
        digest.update(onp.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:12]


def _max_abs_diff(a, b):
    return max((float(onp.max(onp.abs(x - y))) for x, y in zip(a, b) if x.size), default=0.0)


def device_spread(net, trainable=True):
    """Largest absolute difference between the copies of a parameter on its devices.

    ``trainable`` selects the weights (which a correct data-parallel update
    keeps identical: 0 after every step); ``trainable=False`` the state that
    gets no gradient, i.e. BatchNorm's running mean and variance, which MXNet
    keeps per device, each updated from that device's shards only (as in the
    book's code). Returns None when ``net`` has no such parameter.
    """
    spread = None
    for p in net.collect_params().values():
        if (p.grad_req != 'null') != trainable:
            continue
        copies = [d.asnumpy() for d in p.list_data()]
        spread = max([spread or 0.0] + [float(onp.max(onp.abs(c - copies[0])))
                                        for c in copies[1:] if c.size])
    return spread


class ParamTracker:
    """Record after every epoch of several runs how far their parameters are from the first's.

    The first run to report an epoch is the reference: its parameters are kept
    in memory (as NumPy copies, 45 MB an epoch for ResNet-18) and
    later runs are compared with them; nothing is written to disk, so a killed
    run leaves nothing behind. With ``compare=False`` (a single run: nothing to
    compare with) nothing is kept, so memory stays flat over any number of
    epochs. Use as a context manager, or call ``close`` to drop them.

    Attributes
    ----------
    reference : str or None
        Name of the reference run.
    diff : dict of str -> list of float
        Per run, the largest absolute parameter difference to the reference after each epoch.
    spread : dict of str -> list of float
        Per run, ``device_spread`` of the weights after each epoch.
    stats_spread : dict of str -> list of float or None
        Per run, ``device_spread`` of the running statistics after each epoch
        (None for a network without BatchNorm).
    """

    def __init__(self, compare=True):
        self.compare = compare
        self._saved = {}  # epoch -> the reference run's parameters
        self.reference = None
        self.diff, self.spread, self.stats_spread = {}, {}, {}

    def record(self, name, epoch, net):
        """Note the parameters of run ``name`` after ``epoch`` (1-based)."""
        if self.reference is None:
            self.reference = name
        if name == self.reference:
            if self.compare:
                self._saved[epoch] = param_arrays(net)
            diff = 0.0
        else:
            diff = _max_abs_diff(param_arrays(net), self._saved[epoch])
        self.diff.setdefault(name, []).append(diff)
        self.spread.setdefault(name, []).append(device_spread(net))
        self.stats_spread.setdefault(name, []).append(device_spread(net, trainable=False))

    def run_dict(self, result):
        """``result.to_dict()`` with this run's differences (for JSON)."""
        return dict(result.to_dict(), param_diff=self.diff.get(result.kvstore, []),
                    device_spread=self.spread.get(result.kvstore, []),
                    running_stats_spread=self.stats_spread.get(result.kvstore, []))

    def close(self):
        """Drop the saved reference parameters."""
        self._saved.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def epoch_noise(results):
    """The run-to-run noise of ``results``: the largest relative spread of one run's epoch times.

    Each run's spread is (slowest - fastest) / mean of its epochs' training
    seconds; None when no run has two epochs (no spread to measure).
    """
    spreads = [(max(s) - min(s)) / (sum(s) / len(s)) for s in
               ([e.seconds for e in r.epochs] for r in results) if len(s) > 1]
    return max(spreads) if spreads else None


def recommend(results, noise=NOISE, pending=()):
    """Return a sentence naming the fastest kvstore of ``results`` (``TrainResult`` objects).

    A difference counts only when it exceeds both ``noise`` (relative) and
    the spread of epoch times measured within the runs (``epoch_noise``);
    with one epoch per run there is no spread to judge by, and the sentence
    says so instead of naming a winner. ``pending`` names the kvstores of the
    comparison whose runs have not finished (a comparison stopped, or still
    running): the sentence says that they are not in it.
    """
    missing = f'{", ".join(pending)} not measured' if pending else ''
    if len(results) < 2:
        if pending:
            return (f'only kvstore {results[0].kvstore} has finished ({missing}): nothing to '
                    'compare yet.')
        return f'only kvstore {results[0].kvstore} was run; give several to compare.'
    ranked = sorted(results, key=lambda r: r.sec_per_epoch)
    best = ranked[0]
    where = f'on {len(best.devices)} device{"s" if len(best.devices) > 1 else ""}'

    def slower(r):
        return r.sec_per_epoch / best.sec_per_epoch - 1
    measured = epoch_noise(results)
    if measured is None:
        return (f'{where}, kvstore {best.kvstore} was fastest by {slower(ranked[1]):.0%}, but '
                'with one epoch per kvstore that cannot be told from run-to-run noise; train 3 '
                'or more epochs to compare' + (f' ({missing}).' if missing else '.'))
    limit = max(noise, measured)
    close = [r.kvstore for r in ranked if slower(r) <= limit]
    rest = '; '.join(f'{r.kvstore} takes {slower(r):.0%} longer' for r in ranked
                     if slower(r) > limit)
    if len(close) > 1:
        names = f'{", ".join(close[:-1])} and {close[-1]}'
        answer = (f'{where}, kvstores {names} are equally fast (within {limit:.0%}, the '
                  'run-to-run noise measured across epochs)')
    else:
        answer = (f'{where}, kvstore {best.kvstore} is fastest (beyond the {limit:.0%} '
                  'run-to-run noise measured across epochs)')
    return f'{answer}{"; " + rest if rest else ""}{"; " + missing if missing else ""}.'

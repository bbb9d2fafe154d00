"""Comparing runs that differ only in their gradient-synchronisation back end.

Runs with the same seed, data order and learning rate should end every epoch
with the same parameters whatever the kvstore: the kvstores only decide
where the per-device gradients are summed. ``ParamTracker`` checks that
after every epoch (the largest absolute difference to the first run, and the
largest difference between the copies on the devices of one run), and
``recommend`` turns the timings of epochs taken in turn into a sentence
(``paired``).
"""
import hashlib
import itertools

import numpy as onp

from .paired import Paired

__all__ = ['param_arrays', 'fingerprint', 'device_spread', 'ParamTracker', 'paired_epochs',
           'recommend', 'epoch_load']


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
    copies = ([d.asnumpy() for d in p.list_data()] for p in net.collect_params().values()
              if (p.grad_req != 'null') == trainable)  # one parameter's at a time
    spreads = [_max_abs_diff(c[1:], itertools.repeat(c[0])) for c in copies]
    return max([0.0, *spreads]) if spreads else None


class ParamTracker:
    """Record after every epoch of several runs how far their parameters are from the first's.

    The first run to report an epoch is the reference: its parameters are kept
    in memory (as NumPy copies, 45 MB an epoch for ResNet-18) and
    later runs are compared with them; nothing is written to disk, so a killed
    run leaves nothing behind. With ``compare=False`` (a single run: nothing to
    compare with) nothing is kept, so memory stays flat over any number of
    epochs. Use as a context manager, or call ``close`` to drop them.

    Parameters
    ----------
    compare : bool
        Keep the reference's parameters to compare the other runs with (False: one run).

    Attributes
    ----------
    reference : str or None
        Name of the reference run.
    diff : dict of str -> list of float
        Per run, the largest absolute parameter difference to the reference after each epoch.
    spread : dict of str -> list of float
        Per run, ``device_spread`` of the weights after each epoch.
    stats_spread : dict of str -> list of float or None
        Per run, ``device_spread`` of the running statistics after each epoch (None for a
        network without BatchNorm).
    """

    def __init__(self, compare=True):
        # _saved: epoch -> the reference run's parameters; _waiting: epoch -> [(run, index in
        # its diff, parameters)] before the reference's
        self.compare, self._saved, self._waiting = compare, {}, {}
        self.reference, self.diff, self.spread, self.stats_spread = None, {}, {}, {}

    def record(self, name, epoch, net):
        """Note the parameters of run ``name`` after ``epoch`` (1-based).

        Runs taken in turn may reach an epoch before the reference does (a
        round in reverse order): their parameters wait, and their difference
        is filled in when the reference's epoch is recorded.
        """
        self.reference = name if self.reference is None else self.reference
        diffs = self.diff.setdefault(name, [])
        if name == self.reference:
            if self.compare:
                self._saved[epoch] = param_arrays(net)
                for other, index, arrays in self._waiting.pop(epoch, []):
                    self.diff[other][index] = _max_abs_diff(arrays, self._saved[epoch])
            diff = 0.0
        elif epoch in self._saved:
            diff = _max_abs_diff(param_arrays(net), self._saved[epoch])
        else:
            self._waiting.setdefault(epoch, []).append((name, len(diffs), param_arrays(net)))
            diff = '-'  # until the reference's epoch is recorded
        diffs.append(diff)
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
        self._waiting.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def epoch_load(result, epoch):
    """The ``paired.LoadMeter`` figures of ``result``'s ``epoch``, None where none were recorded
    (a result without ``loads``)."""
    return (getattr(result, 'loads', None) or {}).get(epoch)


def paired_epochs(results):
    """A ``paired.Paired`` of the runs' epoch times: round ``e`` is every run's epoch ``e``.

    A run's ``loads`` (epoch -> ``paired.LoadMeter`` figures), where the
    comparison recorded them, go with its epochs.
    """
    pairs = Paired([r.kvstore for r in results])
    for r in results:
        for e in r.epochs:
            pairs.add(r.kvstore, e.epoch, e.seconds, epoch_load(r, e.epoch))
    return pairs


def recommend(results, pending=()):
    """Return a sentence naming the fastest kvstore of ``results`` (``TrainResult`` objects).

    The runs' epochs are rounds, taken in turn (``cli.comparison``): each
    kvstore's time is compared with the fastest's by the ratios of their
    epochs of the same round, and a kvstore is named slower only when the
    interval of that ratio excludes 1 and the difference is ``MIN_EFFECT`` or more
    (``paired.Paired.answer``); the load during the runs follows. ``pending``
    names the kvstores of the comparison that have no epoch measured (a comparison
    stopped, or still running): the sentence says that they are not in it.
    """
    missing = f'{", ".join(pending)} not measured' if pending else ''
    if len(results) < 2:
        if pending:
            return (f'only kvstore {results[0].kvstore} has an epoch measured ({missing}): '
                    'nothing to compare yet.')
        return f'only kvstore {results[0].kvstore} was run; give several to compare.'
    where = f'on {len(results[0].devices)} device{"s" if len(results[0].devices) > 1 else ""}'
    answer = paired_epochs(results).answer('kvstore', where)
    return f'{answer[:-1]}; {missing}.' if missing else answer

"""MXNet's own Gluon API on NumPy 2 and Python 3.12+, after one line: ``import gluon_multigpu``.

For an MXNet user who does not train with gluon-multigpu. MXNet 1.9.1 reads NumPy names that
NumPy 2 removed and hands operator parameters to its library as text, which NumPy 2 writes as
``np.float32(0.1)``; importing the package first makes ``import mxnet`` work anyway, and
changes nothing else (``gluon_multigpu.base.compat`` lists what it does). Three small programs
in the style of MXNet's Gluon documentation follow, on two CPU contexts, each checking its
result against the arithmetic done by hand:

    python examples/plain_mxnet.py      # three lines 'ok'; status 1 if one result is wrong
"""
import gluon_multigpu  # noqa: F401  (the one line: before `import mxnet`)

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

CONTEXTS = [mx.cpu(0), mx.cpu(1)]


def trainer_step():
    """One SGD step of ``gluon.Trainer`` on a one-weight-pair network, hyperparameters given as
    NumPy scalars (which NumPy 2 prints as ``np.float32(0.1)``)."""
    net = gluon.nn.Dense(1, in_units=2, use_bias=False)
    net.initialize(mx.init.One())
    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': np.float32(0.1), 'wd': np.float64(0.0)})
    x, y = nd.array([[1.0, 2.0]]), nd.array([[0.0]])
    with autograd.record():
        loss = gluon.loss.L2Loss()(net(x), y)  # 0.5 * (1 + 2 - 0) ** 2
    loss.backward()
    trainer.step(batch_size=np.int64(1))
    # the gradient is (w . x - y) * x = [3, 6]; w = [1, 1] - 0.1 * [3, 6]
    weight = net.weight.data().asnumpy()  # a sync point: waits for the update
    assert np.isclose(loss.asscalar(), 4.5), loss
    assert np.allclose(weight, [[0.7, 0.4]]), weight
    return f'trainer step: ok (loss 4.5, weight {[round(float(w), 3) for w in weight.ravel()]})'


def kvstore_push_pull(kind):
    """``mx.kv.create(kind)``: a value pushed from each context is summed, and pulled to each."""
    kv = mx.kv.create(kind)
    shape = (2, 3)
    kv.init(3, nd.ones(shape) * 2)
    out = [nd.zeros(shape, ctx=c) for c in CONTEXTS]
    kv.pull(3, out=out)
    assert all((o.asnumpy() == 2).all() for o in out), out  # as initialised
    kv.push(3, [nd.ones(shape, ctx=c) * (i + 1) for i, c in enumerate(CONTEXTS)])
    kv.pull(3, out=out)
    assert all((o.asnumpy() == 3).all() for o in out), out  # 1 + 2: the pushed values summed
    assert [o.context for o in out] == CONTEXTS
    return f'kvstore {kind}: ok (pushed 1 and 2 from {len(CONTEXTS)} contexts, pulled 3)'


def split_and_load():
    """``gluon.utils.split_and_load`` of a batch over two contexts, a forward pass on each and
    one Trainer step on the summed gradients (a shape given as NumPy integers)."""
    data = nd.arange(np.int64(8)).reshape((np.int64(4), np.int64(2)))
    parts = gluon.utils.split_and_load(data, CONTEXTS)
    assert [p.context for p in parts] == CONTEXTS and [p.shape for p in parts] == [(2, 2)] * 2
    assert (nd.concat(*[p.as_in_context(mx.cpu()) for p in parts], dim=0) == data).asnumpy().all()
    net = gluon.nn.Dense(1, in_units=2, use_bias=False)
    net.initialize(mx.init.Zero(), ctx=CONTEXTS)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5})
    with autograd.record():
        losses = [(net(p) - 1).sum() for p in parts]  # d/dw of sum(w . x - 1) = sum of rows
    for loss in losses:
        loss.backward()
    trainer.step(4)
    # the rows sum to [12, 16]; w = 0 - 0.5 * [12, 16] / 4, the same on both contexts
    weights = [net.weight.data(c).asnumpy() for c in CONTEXTS]
    assert all(np.allclose(w, [[-1.5, -2.0]]) for w in weights), weights
    return f'split_and_load: ok ({len(parts)} parts; both contexts at {weights[0].ravel().tolist()})'


def main():
    """Run the three examples; print one line each."""
    for line in (trainer_step(), kvstore_push_pull('local'), kvstore_push_pull('device'),
                 split_and_load()):
        print(line)


if __name__ == '__main__':
    main()

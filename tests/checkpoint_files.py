"""What the checkpoint tests read of a checkpoint folder, and how two runs are compared."""
import json

import mxnet as mx
import numpy as onp


def manifest(ckpt):
    return json.loads((ckpt / 'manifest.json').read_text())


def saved_params(ckpt):
    m = manifest(ckpt)
    arrays = mx.npx.load(str(ckpt / m['files']['params']['name']))
    return {k: v.asnumpy() for k, v in arrays.items()}


def figures(history):
    """What a repeated run must reproduce: everything but the timings."""
    return [(e['epoch'], e['train_loss'], e['train_acc'], e['test_acc'], e['samples'])
            for e in history]


def assert_same_run(a, b, rtol=1e-5):
    ha, hb = figures(manifest(a)['history']), figures(manifest(b)['history'])
    assert [h[0] for h in ha] == [h[0] for h in hb] and [h[4] for h in ha] == [h[4] for h in hb]
    onp.testing.assert_allclose(onp.array(ha)[:, 1:4], onp.array(hb)[:, 1:4], rtol=rtol, atol=2e-3)
    pa, pb = saved_params(a), saved_params(b)
    assert sorted(pa) == sorted(pb)
    for k in pa:
        onp.testing.assert_allclose(pa[k], pb[k], rtol=rtol * 10, atol=1e-5, err_msg=k)

"""scripts/bandwidth.py: the cost of one gradient synchronisation on CPU contexts, and bad input."""
import io
import json
import math
import os
import re

import mxnet as mx
import numpy as onp
import pytest

import gluon_multigpu as gm
from lab.studies import measure
from lab.studies.csvfiles import read_csv
from gluon_multigpu.base.machine import stamp
from conftest import load_script


# nccl on CPU contexts: refused for the build (no NCCL) or, with NCCL, for the devices
NCCL_ON_CPU = ('sums gradients between GPUs' if gm.kvstores.has_nccl()
               else 'needs an MXNet build with NCCL')

MODELS = ['resnet18', 'simple-cnn']
KVSTORES = ['local', 'device', 'none']
COUNTS = [2, 3]


@pytest.fixture(scope='module')
def bandwidth():
    return load_script('bandwidth')


@pytest.fixture(scope='module')
def quick(bandwidth, fashion_dir, tmp_path_factory):
    """One small run over both models, the three CPU kvstores and 2 and 3 contexts."""
    out = tmp_path_factory.mktemp('bandwidth')
    args = bandwidth.build_parser().parse_args([
        '--cpu-devices', '3', '--counts', *map(str, COUNTS), '--quick', '--batch-per-device', '1',
        '--data-dir', str(fashion_dir), '--csv', str(out / 'bw.csv'), '--json',
        str(out / 'bw.json'), '--results', str(out / 'kept.json')])
    printed = io.StringIO()
    bandwidth.run(args, out=printed)
    return {'json': json.loads((out / 'bw.json').read_text()),
            'csv': read_csv(out / 'bw.csv'), 'printed': printed.getvalue(), 'dir': out}


def trainable_count_from_shapes(model):
    """Trainable parameters counted from the model's parameter shapes (after one forward pass)."""
    net = gm.get_model(model, 10)
    net.initialize()
    net(mx.np.zeros((1, 1, 28, 28)))
    return sum(math.prod(p.shape) for p in net.collect_params().values() if p.grad_req != 'null')


def test_every_requested_configuration_is_measured_once(quick):
    rows = quick['json']['rows']
    wanted = {(m, k, n) for m in MODELS for k in KVSTORES for n in COUNTS}
    assert sorted((r['model'], r['kvstore'], r['devices']) for r in rows) == sorted(wanted)
    assert [(r['model'], r['kvstore'], r['devices']) for r in quick['csv']] == \
        [(r['model'], r['kvstore'], r['devices']) for r in rows]
    assert sorted(os.listdir(quick['dir'])) == ['bw.csv', 'bw.json', 'kept.json']  # no temporary files
    assert quick['json']['machine'] == stamp()['machine'] and quick['json']['date']
    assert {(r['machine'], r['date']) for r in quick['csv']} == \
        {(quick['json']['machine'], quick['json']['date'])}
    config = quick['json']['config']
    assert config['counts'] == COUNTS and config['kvstores'] == KVSTORES
    assert config['batch_per_device'] == 1 and config['repeats'] == 2


def test_figures_are_positive_and_follow_their_definitions(quick):
    for r, c in zip(quick['json']['rows'], quick['csv']):
        assert len(r['sync_s_runs']) == r['repeats'] == c['repeats'] == 2
        assert all(t > 0 for t in r['sync_s_runs'] + r['compute_s_runs'])
        assert r['sync_s'] == pytest.approx(sum(r['sync_s_runs']) / 2)  # median of two
        assert r['compute_s'] == pytest.approx(sum(r['compute_s_runs']) / 2)
        n = c['devices']
        # GB/s from the CSV fields, against the definitions in --help
        assert c['alg_gbps'] == pytest.approx(c['grad_bytes'] / c['sync_s'] / 1e9, rel=1e-12)
        assert c['bus_gbps'] == pytest.approx(2 * (n - 1) / n * c['alg_gbps'], rel=1e-12)
        assert c['sync_per_compute'] == pytest.approx(c['sync_s'] / c['compute_s'], rel=1e-12)
        assert c['sync_s'] == pytest.approx(r['sync_s'], rel=1e-12)
        assert c['sync_s'] > 0 and c['compute_s'] > 0 and c['alg_gbps'] > 0
    # the compute of a step does not depend on the kvstore: one timing per model and count
    for m in MODELS:
        for n in COUNTS:
            assert len({r['compute_s'] for r in quick['csv']
                        if r['model'] == m and r['devices'] == n}) == 1


def test_gradient_bytes_are_four_per_trainable_parameter(quick):
    # the simple CNN counted by hand: conv 1->20 3x3, conv 20->50 5x5, dense 800->128, 128->10
    by_hand = (20 * 9 + 20) + (50 * 20 * 25 + 50) + (128 * 50 * 4 * 4 + 128) + (10 * 128 + 10)
    expected = {'resnet18': trainable_count_from_shapes('resnet18'),
                'simple-cnn': trainable_count_from_shapes('simple-cnn')}
    assert expected == {'resnet18': 11_175_818, 'simple-cnn': by_hand}
    for r in quick['csv']:
        assert r['params'] == expected[r['model']]
        assert r['grad_bytes'] == 4 * expected[r['model']]


def test_printed_table_has_every_row_and_the_argument(quick):
    text = quick['printed']
    for r in quick['json']['rows']:
        line = re.search(rf"^\| {r['model']} \| {r['devices']} cpu \| {r['kvstore']} \| "
                         rf"([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
        assert line, r
        assert float(line.group(1)) == pytest.approx(r['grad_bytes'] / 1e6, abs=0.006)
        assert float(line.group(2)) == pytest.approx(r['sync_s'] * 1e3, abs=0.006)
        assert float(line.group(3)) == pytest.approx(r['alg_gbps'], abs=6e-4)
    assert 'resnet18 (11,175,818 parameters, 44.7 MB of gradients): one synchronisation costs' \
        in text


@pytest.mark.parametrize('kvstore', KVSTORES)
def test_what_is_timed_is_a_real_synchronisation(kvstore, fashion_test):
    devices = gm.cpu_devices(2)
    net = measure.build_net('simple-cnn', devices)
    X, y = measure.real_batch(*fashion_test, 8)
    measure.time_compute(net, X, y, devices, repeats=0)  # fills each device's gradient
    before = [[g.asnumpy() for g in p.list_grad()] for p in measure.trainable_params(net)]
    assert any(not onp.allclose(g[0], g[1]) for g in before)  # the shards differ
    measure.sync_trainer(net, kvstore).allreduce_grads()
    for p, grads in zip(measure.trainable_params(net), before):
        for g in p.list_grad():
            onp.testing.assert_allclose(g.asnumpy(), grads[0] + grads[1], rtol=1e-5, atol=1e-7)
    # time_sync divides each sum by the device count again, so repeats never grow the values
    measure.time_sync(net, kvstore, 2, repeats=3)
    for p, grads in zip(measure.trainable_params(net), before):
        for g in p.list_grad():
            onp.testing.assert_allclose(g.asnumpy(), grads[0] + grads[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('argv, message', [
    (['--num-gpus', str(gm.num_gpus() + 1)], 'GPU(s) requested but'),
    (['--counts', '1', '2'], 'needs at least 2 devices, got a count of 1'),
    (['--cpu-devices', '4', '--counts', '2', '8'], '--counts 8 exceeds --cpu-devices 4'),
    (['--cpu-devices', '1'], '--cpu-devices 1 gives no device count of at least 2'),
    (['--cpu-devices', '2', '--kvstores', 'device', 'nccl'], NCCL_ON_CPU),
    (['--cpu-devices', '2', '--data-dir', '/no/such/dir'], '/no/such/dir does not exist'),
    (['--cpu-devices', '2', '--csv', '/no/such/dir/bw.csv'], 'does not exist; create it first'),
    (['--cpu-devices', '2', '--json', '{tmp}'], 'is a directory; give a file name'),
    (['--cpu-devices', '2', '--data-dir', '{truncated}', '--json', '{tmp}/bw.json'],
     'not a complete gzip file'),
])
def test_bad_input_is_one_line_and_status_2(bandwidth, argv, message, tmp_path, truncated_dir,
                                            capsys):
    argv = [a.format(tmp=tmp_path, truncated=truncated_dir) for a in argv]
    assert bandwidth.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == '' and len(captured.err.splitlines()) == 1
    assert message in captured.err and 'Traceback' not in captured.err
    assert os.listdir(tmp_path) == []


def test_unwritable_output_directory_is_refused(bandwidth, unwritable_dir, capsys):
    path = os.path.join(unwritable_dir, 'bw.csv')
    assert bandwidth.main(['--cpu-devices', '2', '--csv', path]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f'cannot create files in {unwritable_dir}' in err
    assert not os.path.exists(path)


@pytest.mark.parametrize('argv, message', [
    (['--models', 'vgg'], "invalid choice: 'vgg'"),
    (['--kvstores', 'dist_sync'], "invalid choice: 'dist_sync'"),
    (['--repeats', '0'], '0 is not positive'),
    (['--batch-per-device', '-4'], '-4 is not positive'),
    (['--counts', 'two'], "'two' is not an integer"),
    (['--seed', '-1'], '-1 is negative'),
    (['--num-gpus', '2', '--cpu-devices', '2'], 'not allowed with argument'),
])
def test_bad_arguments_stop_with_status_2(bandwidth, argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        bandwidth.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and message in err


def test_help_states_units_and_defaults(bandwidth, capsys):
    with pytest.raises(SystemExit):
        bandwidth.main(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    for phrase in ('GB = 1e9 bytes', '2 (N - 1) / N x alg GB/s', '(default: 32',
                   'default without GPUs: counts 2 and 4', 'npx.waitall()', 'exit status 2',
                   '(default: 5; 2 with --quick)'):
        assert phrase in text

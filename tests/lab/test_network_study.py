"""The network model against a shaped network (``lab.studies.network_study``, scripts/network.py).

The predictions recomputed by hand from the models' layers and the links'
rates; the parser of step times on a made-up launcher output; and real
``--quick`` runs on a cluster of namespaces (skipped where none can be
made): the table has a measured and a predicted step per row, Ctrl-C keeps
the rows measured, and no process of the runs is left anywhere.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, Lines, run_bounded, wait_bounded
from lab.commands import network as cli
from lab.hosts import cluster
from lab.studies import network_study as network

AVAILABLE = cluster.available()
pytestmark = pytest.mark.xdist_group('serial')  # conftest.SERIAL
needs_cluster = pytest.mark.skipif(not AVAILABLE[0], reason=f'no cluster here: {AVAILABLE[1]}')
NETWORK = str(REPO / 'scripts' / 'network.py')

#: Trainable parameters, and the largest parameter's, of each model (counted from its layers).
PARAMS = {'resnet18': (11_175_818, 512 * 512 * 3 * 3),
          'simple-cnn': (20 * 9 + 20 + 50 * 20 * 25 + 50 + 128 * 800 + 128 + 10 * 128 + 10,
                         128 * 800)}
#: Bits per second of the rates.
BITS = {'100mbit': 100e6, '1gbit': 1e9}


def test_the_constants_are_the_built_networks():
    from lab.studies import measure
    import mxnet as mx
    for model, (params, largest) in PARAMS.items():
        net = measure.build_net(model, [mx.cpu()])
        net(mx.np.zeros((1, 1, 28, 28)))
        sizes = [p.data().size for p in measure.trainable_params(net)]
        assert (sum(sizes), max(sizes)) == (params, largest)
        assert measure.gradient_bytes(net)[1] == network.GRAD_BYTES[model] == 4 * params
        assert network.LARGEST_KEY_BYTES[model] == 4 * largest


@pytest.mark.parametrize('model', list(PARAMS))
@pytest.mark.parametrize('workers', [1, 2, 3])
@pytest.mark.parametrize('rate', list(BITS))
def test_the_rows_predict_what_the_model_computes_by_hand(model, workers, rate):
    unshaped, measured = 0.7, 3.1
    row = network.table_row(network.Config(model, workers, rate, 16, 3), unshaped, measured,
                            others_cores=0.05)
    grad, largest = 4 * PARAMS[model][0], 4 * PARAMS[model][1]
    payload = BITS[rate] / 8 * 1448 / 1514  # bytes/s of TCP payload in full Ethernet frames
    t_net = (grad + largest) * max(1, workers / 1) / payload  # one server
    old = 2 * grad * max(1, workers) / (BITS[rate] / 8)
    assert row['t_net_s'] == pytest.approx(t_net, rel=1e-12)
    assert row['predicted_s'] == pytest.approx(unshaped + t_net, rel=1e-12)
    assert row['ratio'] == pytest.approx(measured / (unshaped + t_net), rel=1e-12)
    assert row['overlapped_s'] == pytest.approx(max(unshaped, t_net), rel=1e-12)
    assert row['t_net_old_s'] == pytest.approx(old, rel=1e-12)
    assert row['ratio_old'] == pytest.approx(measured / (unshaped + old), rel=1e-12)
    assert (row['measured_s'], row['unshaped_s'], row['status']) == (measured, unshaped, 'ok')
    assert list(row) == network.ROW_COLUMNS
    missing = network.table_row(network.Config(model, workers, rate, 16, 3), None, measured)
    assert missing['predicted_s'] is None and missing['ratio'] is None


def test_the_table_has_one_line_per_row_sorted_with_dashes_for_what_is_missing():
    rows = [network.table_row(network.Config('simple-cnn', 2, '1gbit', 64, 5), 0.05, 0.07),
            network.table_row(network.Config('resnet18', 3, '1gbit', 16, 3), 1.2, 3.0),
            network.table_row(network.Config('resnet18', 3, '100mbit', 16, 3), 1.2, None, 0.1,
                              'timed out after 90 s')]
    lines = network.markdown_table(rows).splitlines()
    assert len(lines) == 5 and lines[0].startswith('| model | workers | bandwidth |')
    assert [line.split(' | ')[:3] for line in lines[2:]] == [
        ['| resnet18', '3', '100mbit'], ['| resnet18', '3', '1gbit'], ['| simple-cnn', '2', '1gbit']]
    assert '| - (timed out after 90 s) | - |' in lines[2]
    assert lines[4].split(' | ')[3:11] == [
        '0.050', f"{rows[0]['predicted_s']:.3f}", '0.070', f"{rows[0]['ratio']:.2f}", '0.050',
        f"{rows[0]['predicted_old_s']:.3f}", f"{rows[0]['ratio_old']:.2f}", '- |']


#: What the launcher prints for a run of 4 steps per epoch: rank 0 is worker 1 here.
OUTPUT = '''\
[worker 0@198.18.7.4] rank 1: training resnet18 on fashion-mnist: 64 train / 0 test images, ...
[worker 1@198.18.7.5] training resnet18 on fashion-mnist: 64 train / 1 test images, ...
[worker 1@198.18.7.5 as rank 0] epoch 1: 2/4 batches, 3 images/s, epoch ends in 20 s
[worker 0@198.18.7.4 as rank 1] rank 1: epoch 1/2: loss 2.3339, train acc 0.188, 37.1 s, 1 samples/s, parameters 6f1e10bbdcb4
[worker 1@198.18.7.5 as rank 0] epoch 1/2: loss 2.3228, train acc 0.125, test acc 0.062, 37.5 s, 1 samples/s, parameters d01d08867189
[worker 1@198.18.7.5 as rank 0] epoch 2/2: loss 2.2768, train acc 0.062, test acc 0.062, 19.9 s, 2 samples/s, parameters fa3634b1804d
[worker 1@198.18.7.5 as rank 0] test acc: 0.06, 28.7 sec/epoch on 2 workers x [cpu(0)]
[worker 0@198.18.7.4 as rank 1] rank 1: epoch 2/2: loss 2.2464, train acc 0.188, 23.4 s, 1 samples/s, parameters 0fefd5ff24e3
launch: every process has ended
'''


def test_the_parser_reads_each_ranks_epochs_and_rank_0s_timed_epoch(tmp_path):
    assert network.parse_epochs(OUTPUT) == {0: {1: 37.5, 2: 19.9}, 1: {1: 37.1, 2: 23.4}}
    assert network.step_seconds(4, OUTPUT) == pytest.approx(19.9 / 4)
    assert network.step_seconds(4, OUTPUT, epoch=1) == pytest.approx(37.5 / 4)
    assert network.step_seconds(4, OUTPUT.replace('epoch 2/2: loss 2.2768', 'x')) is None
    assert network.step_seconds(4, '') is None
    # rank 0's --json, to full precision, comes first; a file without the epoch falls back
    path = tmp_path / 'run.json'
    path.write_text(json.dumps({'runs': [{'epochs': [{'epoch': 1, 'seconds': 37.51},
                                                     {'epoch': 2, 'seconds': 19.873}]}]}))
    assert network.step_seconds(4, OUTPUT, str(path)) == pytest.approx(19.873 / 4)
    path.write_text('{"runs": [{"epochs": [{"epoch": 1, "seconds": 37.51}]}]}')
    assert network.step_seconds(4, OUTPUT, str(path)) == pytest.approx(19.9 / 4)
    assert network.step_seconds(4, OUTPUT, str(tmp_path / 'missing.json')) == \
        pytest.approx(19.9 / 4)


def test_the_plan_runs_the_unshaped_step_first_on_one_cluster_per_worker_count():
    runs = network.plan(['resnet18', 'simple-cnn'], [2, 3], ['100mbit', '1gbit'])
    assert list(runs) == [2, 3]
    assert [(c.model, c.bandwidth) for c in runs[2]] == [
        ('resnet18', None), ('resnet18', '100mbit'), ('resnet18', '1gbit'),
        ('simple-cnn', None), ('simple-cnn', '100mbit'), ('simple-cnn', '1gbit')]
    assert {c.steps for cs in runs.values() for c in cs} == {None}  # chosen when they run
    c = runs[3][1]
    # ResNet-18 at 100 Mbit/s: more than 2 s a step, the fewest steps; unshaped, about 1 s: more
    assert network.steps_for(c, unshaped_s=1.0) == network.DEFAULT_STEPS['resnet18'] == 3
    assert network.steps_for(runs[3][0], unshaped_s=1.0) == 6
    assert network.steps_for(runs[3][3], unshaped_s=0.05) == 120  # simple-cnn: 6 s / 0.05 s
    assert network.steps_for(network.Config('resnet18', 3, None, 16, 2), unshaped_s=1.0) == 2
    c = network.Config('resnet18', 3, '100mbit', 16, 3)
    assert c.num_train == 16 * 3 * 3
    argv = network.launch_argv(c, '/h', '/j.json')
    assert argv[:2] == [sys.executable, str(REPO / 'scripts' / 'launch.py')]
    worker = argv[argv.index('--') + 1:argv.index('--') + 5]
    assert worker[1:] == ['OMP_NUM_THREADS=1', sys.executable, str(REPO / 'scripts' / 'train.py')]
    assert os.path.basename(worker[0]) == 'env'
    unthreaded = network.launch_argv(network.Config('resnet18', 3, None, 16, 3, 0), '/h', '/j')
    assert unthreaded[unthreaded.index('--') + 1] == sys.executable
    assert ' '.join(argv).endswith('--num-train 144 --num-test 1 --num-epochs 2 '
                                   '--progress-interval 0 --json /j.json')
    # the default study stays within ~15 minutes (the estimate of a run without retries)
    assert sum(network.estimate_seconds(c, cores=2) for cs in runs.values() for c in cs) < 15 * 60


def test_the_help_and_a_bad_rate(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(['--help'])
    assert stop.value.code == 0 and 'full overlap  max(unshaped, t_net)' in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        cli.main(['--bandwidths', '100mbit', 'fast'])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count('\n') == 1 and 'error: argument --bandwidths: ' in err
    assert "not a tc rate: 'fast'" in err and err.endswith('(see --help)\n')


def test_without_a_cluster_it_says_why_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cluster, 'available', lambda: (False, 'no OpenSSH server at /usr/sbin/sshd'))
    assert cli.main(['--quick']) == 2
    out, err = capsys.readouterr()
    assert out == '' and err.count('\n') == 1 and err.startswith('error: ')
    assert 'none can be made here' in err and err.endswith(': no OpenSSH server at /usr/sbin/sshd\n')


def processes_mentioning(text):
    """The processes (other than this one) whose command line contains ``text``."""
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f'/proc/{entry}/cmdline', 'rb') as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def numbers(line):
    return re.findall(r'\d+\.\d+', line)


@needs_cluster
@pytest.mark.slow  # jobs on a cluster, as the multi-host tests: the full suite's
def test_a_quick_study_measures_and_predicts_each_row_and_leaves_nothing(tmp_path):
    # TMPDIR: the cluster's files and the runs' JSON, named on every command line of the runs
    env = dict(os.environ, TMPDIR=str(tmp_path / 'tmp'))
    (tmp_path / 'tmp').mkdir()
    out = tmp_path / 'out'
    proc = run_bounded([sys.executable, NETWORK, '--quick', '--out', str(out)], env=env,
                       timeout=180)
    assert proc.returncode == 0, proc.stderr
    said = proc.stderr.splitlines()
    assert said[0].startswith('network study: 2 runs on clusters of 4 hosts, about ')
    assert said[1].startswith('[1/2] simple-cnn, 2 workers, unshaped: batch 64 per worker, 2 '
                              f'epochs of {network.QUICK_STEPS} steps; about ')
    assert any(line.startswith('[2/2] simple-cnn, 2 workers, 1gbit') for line in said)
    table = proc.stdout.splitlines()
    assert len(table) == 3 and table[2].startswith('| simple-cnn | 2 | 1gbit | ')
    unshaped, predicted, measured, ratio = numbers(table[2])[:4]
    assert float(predicted) > float(unshaped) > 0 and float(measured) > 0
    assert (out / 'results.md').read_text().endswith(proc.stdout)
    results = json.loads((out / 'results.json').read_text())
    [row] = results['rows']
    assert row['status'] == 'ok' and row['measured_s'] > 0 and row['predicted_s'] > 0
    assert row['ratio'] == pytest.approx(row['measured_s'] / row['predicted_s'])
    assert [(r['bandwidth'], r['leftover']) for r in results['runs']] == [(None, {}), ('1gbit', {})]
    assert results['config']['command'].startswith('python ') and '--quick' in \
        results['config']['command']
    assert results['machine'] and results['date']  # the stamp tools/figures.py asks of a file
    assert sorted(os.listdir(out / 'logs')) == ['simple-cnn-2w-1gbit.log',
                                                'simple-cnn-2w-unshaped.log']
    assert processes_mentioning(str(tmp_path)) == []
    assert os.listdir(tmp_path / 'tmp') == []  # the cluster's and the runs' files are gone


@needs_cluster
@pytest.mark.slow  # jobs on a cluster, as the multi-host tests: the full suite's
def test_ctrl_c_stops_the_run_in_progress_and_keeps_the_rows_measured(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path / 'tmp'))
    (tmp_path / 'tmp').mkdir()
    out = tmp_path / 'out'
    proc = subprocess.Popen([sys.executable, NETWORK, '--quick', '--bandwidths', '1gbit',
                             '100mbit', '--out', str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        err = Lines(proc.stderr)
        Lines(proc.stdout)
        err.wait_for(r'^\[3/3\] simple-cnn, 2 workers, 100mbit', timeout=150)
        time.sleep(1)  # its launcher is under way
        proc.send_signal(signal.SIGINT)
        assert wait_bounded(proc, 60) == 130
    finally:
        proc.kill()
    last = err.text()[-1]
    assert last.startswith('interrupted by SIGINT: ') and 'removed its cluster' in last
    assert last.endswith(f'the rows measured are in {out}')
    results = json.loads((out / 'results.json').read_text())
    assert [r['bandwidth'] for r in results['rows']] == ['1gbit']
    assert '| simple-cnn | 2 | 1gbit |' in (out / 'results.md').read_text()
    assert processes_mentioning(str(tmp_path)) == []
    assert os.listdir(tmp_path / 'tmp') == []

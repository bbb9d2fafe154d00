"""The fault study (``lab.studies.failover_study``, ``scripts/failover.py``).

Its reading of the launcher's output on made-up lines; its table; its command
line's one-line errors; and one real fault on a cluster of four hosts (a worker
killed in the middle of epoch 2, restarted from its checkpoint): detected at
once, recovered, the final parameters those of the uninterrupted run, no
process left. The real run is skipped, with the reason, where no cluster can
be made here (not root, no ``ip netns``, no sshd).
"""
import sys

import pytest

from cluster_fixture import make_cluster  # noqa: F401  (a fixture)
from conftest import REPO, run_bounded, load_script
from process_state import Load
from lab.studies import failover_study as failover

pytestmark = pytest.mark.xdist_group('serial')  # conftest.SERIAL: a cluster; timed

H = ['198.18.9.2', '198.18.9.3', '198.18.9.4', '198.18.9.5']
P = '  kvstore dist_sync on 1 CPU: '
#: What the launcher says when worker 0 (rank 1, host 2) is killed at 10.0 s and the job restarts.
RESTARTED = [
    (3.0, f'[worker 1@{H[3]} as rank 0] training simple-cnn on fashion-mnist: 1280 train / 500 '
          'test'),
    (9.0, f'[worker 1@{H[3]} as rank 0] epoch 1/3: loss 2.2386, train acc 0.194, test acc 0.290, '
          '2.0 s, 635 samples/s, parameters 8afb9e08fb7d'),
    (9.8, f'[worker 1@{H[3]} as rank 0] {P}epoch 2: 6/20 batches, 900 images/s'),
    (10.1, f'launch: worker 0@{H[2]} as rank 1 failed (signal SIGKILL); stopping the job'),
    (10.2, f'[worker 1@{H[3]} as rank 0] SIGTERM: stopping after the current step'),
    (13.5, f'launch: restart 1 of 2: starting the job again from its checkpoint on 4 host(s) '
           f'({", ".join(H)})'),
    (17.0, f'[worker 0@{H[2]} as rank 0] resuming from the checkpoint epoch 1, in /tmp/ck'),
    # replayed from the checkpoint: not a step of the restarted job
    (17.0, f'[worker 0@{H[2]} as rank 0] epoch 1/3: loss 2.2386, train acc 0.194, test acc 0.290, '
           '2.0 s, 635 samples/s'),
    (17.1, f'[worker 1@{H[3]} as rank 1] rank 1: epoch 1/3: loss 2.2386, train acc 0.194, 2.0 s, '
           '635 samples/s'),
    (17.6, f'[worker 1@{H[3]} as rank 1] {P}epoch 2: 3/20 batches, 400 images/s'),
    (18.0, f'[worker 0@{H[2]} as rank 0] {P}epoch 2: 4/20 batches, 500 images/s'),
    (20.0, f'[worker 0@{H[2]} as rank 0] epoch 2/3: loss 1.9178, train acc 0.348, test acc 0.376, '
           '2.6 s, 498 samples/s, parameters 4a5be3a91fac'),
    (23.0, f'[worker 0@{H[2]} as rank 0] epoch 3/3: loss 1.2933, train acc 0.513, test acc 0.532, '
           '2.4 s, 520 samples/s, parameters 7aba886cdda5'),
    (23.0, f'[worker 0@{H[2]} as rank 0] test acc: 0.53, 2.3 sec/epoch on 2 workers x [cpu(0)]'),
]


def test_the_times_are_read_from_the_fault_on():
    t = failover.parse_times(RESTARTED, fault_at=10.0)
    assert t['detect_s'] == pytest.approx(0.1)
    assert t['detected_by'] == f'worker 0@{H[2]} as rank 1 failed (signal SIGKILL)'
    assert t['restarts'] == 1 and t['restart_s'] == pytest.approx(3.5)
    assert t['restart_hosts'] == H
    # the first step of the restarted job: rank 1's progress line, not the replayed epoch lines
    assert t['recover_s'] == pytest.approx(7.6)
    assert t['resumed_from'] == 'epoch 1'
    assert (t['rank0_before'], t['rank0_after']) == (H[3], H[2])
    assert t['fingerprint'] == '7aba886cdda5' and not t['gave_up']
    # in any order (two streams read by two threads), the same
    assert failover.parse_times(RESTARTED[::-1], fault_at=10.0) == t


def test_lines_before_the_fault_do_not_count_and_a_job_cut_short_has_no_final_parameters():
    lines = [(1.0, f'launch: worker 0@{H[2]} as rank 1 failed (status 1); stopping the job'),
             (4.0, f'[worker 1@{H[3]} as rank 0] epoch 1/3: loss 2.2, train acc 0.19, 2.0 s, '
                   '635 samples/s, parameters 8afb9e08fb7d'),
             (5.0, f'launch: worker 0@{H[2]} as rank 1 not heard from {H[2]} for 5 s (host or link '
                   'down); stopping the job')]
    t = failover.parse_times(lines, fault_at=2.0)
    assert t['detect_s'] == 3.0 and 'not heard from' in t['detected_by']
    assert t['restarts'] == 0 and t['restart_s'] is None and t['recover_s'] is None
    assert t['fingerprint'] is None  # epoch 1 of 3: not the job's end
    assert failover.parse_times(lines, fault_at=6.0)['detect_s'] is None
    spent = lines + [(9.0, 'launch: restart 2 of 2: starting the job again from its checkpoint '
                           f'on 3 host(s) ({H[0]}, {H[1]}, {H[3]})'),
                     (20.0, 'launch: gave up after 2 restart(s) (--max-restarts 2)')]
    t = failover.parse_times(spent, fault_at=2.0)
    assert t['restarts'] == 1 and t['gave_up'] and t['restart_hosts'] == [H[0], H[1], H[3]]


def row(**changes):
    r = {'fault': 'worker-killed', 'label': 'worker killed', 'host': H[2], 'max_restarts': 2,
         'timeout': 5.0, 'injected_at': 'epoch 2, step 6/20', 'hung': False, 'error': None,
         'load': [1.0, 2.0], 'duration_s': 20.0, 'status': 0, 'lost_s': 9.0, 'equal': True,
         'host_empty_s': 0.1, 'cleared_s': 0.0, 'left': {}, 'sshd_sessions': 0, 'problems': []}
    r.update(failover.parse_times(RESTARTED, 10.0))
    r.update(changes)
    return r


def test_a_row_of_the_table_says_what_was_measured_and_marks_what_went_wrong():
    line = failover.markdown_row(row())
    assert line.count('|') == failover.markdown_header().splitlines()[0].count('|')
    assert '| 0.1 | 3.5 | 7.6 | 9.0 | 0 | = reference (`7aba886cdda5`) | 0.1 | nothing |' in line
    bad = failover.markdown_row(row(equal=False, left={'2': ['123 /usr/bin/python train.py']},
                                    sshd_sessions=1, detected_by=None, detect_s=None))
    assert '**differ**' in bad and '**host 2: /usr/bin/python train.py**, 1 sshd' in bad
    assert '**not detected**' in bad
    assert 'PROBLEMS: hung' in failover.summary(row(problems=['hung: stopped by the study']))


def test_the_estimate_counts_the_timeout_for_a_silent_fault():
    killed, cut = failover.FAULTS['worker-killed'], failover.FAULTS['link-down']
    assert failover.estimate_seconds(cut, 10.0) - failover.estimate_seconds(killed, 10.0) == \
        pytest.approx(failover.TIMEOUT - 0.5)
    assert failover.estimate_seconds(None, 10.0) == 10.0
    assert failover.estimate_seconds(failover.FAULTS['worker-killed-no-restart'], 10.0) < 10.0


def test_the_command_line_says_what_is_wrong_in_one_line(monkeypatch, capsys, tmp_path):
    program = load_script('failover')
    monkeypatch.setattr(program.cluster, 'available', lambda: (False, 'network namespaces need '
                                                              'root (this process runs as uid 1)'))
    assert program.main(['--out', str(tmp_path / 'o')]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('error: no cluster can be made here: ')
    assert err.endswith('network namespaces need root (this process runs as uid 1)\n')
    assert not (tmp_path / 'o').exists()
    monkeypatch.setattr(program.cluster, 'available', lambda: (True, ''))
    assert program.main(['--data-dir', str(tmp_path), '--out', str(tmp_path / 'o')]) == 2
    assert capsys.readouterr().err.count('\n') == 1
    proc = run_bounded([sys.executable, str(REPO / 'scripts' / 'failover.py'), '--faults',
                        'worker-lost'], timeout=60)
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1
    assert "invalid choice: 'worker-lost'" in proc.stderr


@pytest.mark.slow
def test_a_worker_killed_is_detected_at_once_and_the_restarted_job_ends_as_the_uninterrupted(
        make_cluster, fashion_dir, tmp_path):
    # two epochs (the fault in the second) to keep it short
    reference = failover.run_job(make_cluster(failover.HOSTS), None, fashion_dir, tmp_path,
                                 epochs=2, log=tmp_path / 'reference.log')
    assert reference['status'] == 0 and reference['fingerprint'], reference
    fault = failover.FAULTS['worker-killed']
    r = failover.run_job(make_cluster(failover.HOSTS), fault, fashion_dir, tmp_path, reference,
                         epochs=2, log=tmp_path / 'fault.log')
    said = (tmp_path / 'fault.log').read_text()
    assert r['problems'] == [], said
    assert r['injected_at'].startswith('epoch 2, step '), said
    load = Load()  # the seconds below: room on a quiet machine, scaled by the load measured
    # the agent's exit line, at once
    assert r['detect_s'] < load.room(2) and 'failed (signal SIGKILL)' in r['detected_by'], \
        (r['detect_s'], str(load))
    assert r['restarts'] == 1 and r['restart_s'] < r['recover_s'] < load.room(60), (said, str(load))
    assert r['resumed_from'] == 'epoch 1'
    assert r['status'] == 0 and r['equal'] is True
    assert r['left'] == {} and r['host_empty_s'] < load.room(2), (r['host_empty_s'], str(load))

"""A hung job names its stuck worker: one dist_sync worker hangs inside a step, and the launcher
says which (host, rank, step) within the stall time, with every worker's stack, status 3, and no
process left."""
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, Lines, run_bounded, wait_bounded
from gluon_multigpu.multihost.hung import DUMP_WAIT
from gluon_multigpu.multihost.plan import TERM_WAIT
from process_state import Load
from test_distributed import LAUNCH, gone, train_args, watch_children

HANG = str(REPO / 'tests' / 'hang_worker.py')
#: The workers' --stall-timeout (seconds).
STALL = 10
#: How much later than the stall time the launcher's line may come: it looks every 0.1 s, the
#: last step was reported before the hang began, and the processes get DUMP_WAIT for their stacks;
#: the rest, ROOM on a quiet machine, is slack, scaled by the load measured
#: (``process_state.Load``).
ROOM = 10

#: The launcher's line for worker I (rank 1) stuck in step 3 while worker J (rank 0) waits.
NAMED = re.compile(r"^launch: worker (\d)@127\.0\.0\.1 as rank 1 is stuck in step 3: no worker "
                   rf"queued a step for {STALL} s, and the other workers wait for it \(worker "
                   r"(\d)@127\.0\.0\.1 as rank 0 after step (\d+)\); every worker's Python stack "
                   r'is in its output; stopping the job$')


def stacks_of(out, index, rank):
    """The lines of faulthandler's dump in the output of worker ``index`` (rank ``rank``)."""
    prefix = f'[worker {index}@127.0.0.1 as rank {rank}] '
    return [l[len(prefix):] for l in out if l.startswith(prefix)
            and re.match(r'(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$|'
                         r'  File ".*", line \d+ in \w+$', l[len(prefix):])]


@pytest.mark.slow  # a launched job
@pytest.mark.xdist_group('timing')  # conftest.TIMING: times the launcher's answer
def test_a_worker_hung_in_a_step_is_named_with_its_host_rank_and_step_and_nothing_is_left(
        fashion_dir, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, LAUNCH, '-n', '2', '-s', '1', '--', sys.executable, HANG, '--kvstore',
         'dist_sync', '--cpu-devices', '1', *train_args(fashion_dir),
         '--stall-timeout', str(STALL)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=dict(os.environ, GLUON_MULTIGPU_TEST_HANG='1:3'))  # rank 1, its third step
    try:
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        job, seen = watch_children(proc, out, r'\] test hang: rank 1 blocks in step 3$')
        assert len(job) == 12  # 4 agents, their 4 keepers, the keepers' 4 processes
        hung_at, hang = out.wait_for(r'\] test hang: rank 1 blocks in step 3$')
        # (measured while the stall time runs: the deadlines are beyond the bounds at any load)
        early = Load()
        named_at, line = err.wait_for(r'^launch: .* stuck in step',
                                      timeout=STALL + DUMP_WAIT + early.room(ROOM) + 30)
        status = wait_bounded(proc, 2 * TERM_WAIT + early.room(30) + 60)
        ended = time.monotonic()
        out.wait_ended(), err.wait_ended()
    finally:
        proc.kill()
    load = Load()
    assert status == 3, err.text()
    named = NAMED.match(line)
    assert named, line
    hung, waiting = named.group(1), named.group(2)
    assert hang.startswith(f'[worker {hung}@127.0.0.1 as rank 1] ')  # the one that hung
    assert {hung, waiting} == {'0', '1'} and int(named.group(3)) >= 2
    late = DUMP_WAIT + load.room(ROOM)
    assert STALL <= named_at - hung_at < STALL + late, (
        f'named {named_at - hung_at:.1f} s after the hang, not within {STALL} to '
        f'{STALL + late:.1f} s; {load}')
    # then stopped: SIGTERM, SIGKILL, the servers
    assert ended - named_at < 2 * TERM_WAIT + load.room(30), (
        f'ended {ended - named_at:.1f} s after the line; {load}')
    # every worker wrote its stacks: the hung one inside Trainer.step, the other waiting in MXNet
    text = out.text()
    hung_stack, waiting_stack = stacks_of(text, hung, 1), stacks_of(text, waiting, 0)
    assert any(l.startswith('Current thread') for l in hung_stack), text
    assert any(l.endswith(' in stepping') for l in hung_stack), hung_stack  # hang_worker's step
    assert any(l.startswith('Current thread') for l in waiting_stack), text
    assert any('section/steps.py' in l for l in waiting_stack), waiting_stack
    assert 'Traceback' not in '\n'.join(text + err.text())
    assert gone(seen, timeout=10)  # servers, scheduler, workers, agents, keepers: none is left


@pytest.mark.slow  # subprocesses
@pytest.mark.xdist_group('timing')  # conftest.TIMING: times the stop
def test_a_command_that_queues_no_step_for_the_step_timeout_stops_the_job_with_status_3(tmp_path):
    # A worker that reports one step to its launcher (as distributed.Control does) and then
    # waits for good, as one deadlocked inside MXNet would. It asked for no stacks (no handler
    # of the dump signal): the launcher's request for them must not end it.
    hang = ('import os, signal, time; '
            'fd = int(os.environ["GLUON_MULTIGPU_CONTROL"].split(",")[1]); '
            'signal.signal(signal.SIGTERM, lambda *a: (print("SIGTERM", flush=True), '
            'os._exit(0))); '
            'os.write(fd, b"step 1\\n"); print("stepped", flush=True); time.sleep(600)')
    started = time.monotonic()
    proc = run_bounded([sys.executable, LAUNCH, '-n', '1', '--step-timeout', '2', '--',
                        sys.executable, '-c', hang], cwd=tmp_path, timeout=300)
    took = time.monotonic() - started
    load = Load()
    assert proc.returncode == 3, proc.stderr
    assert re.search(r"^launch: worker 0@127\.0\.0\.1 is stuck in step 2: it queued no step for "
                     r"2 s; every worker's Python stack is in its output; stopping the job$",
                     proc.stderr, re.M), proc.stderr
    assert '[worker 0@127.0.0.1] stepped' in proc.stdout
    assert '[worker 0@127.0.0.1] SIGTERM' in proc.stdout  # the dump signal did not end it
    # the step timeout, the stacks, SIGTERM: the launcher's and the worker's start are the room
    assert took < 2 + DUMP_WAIT + TERM_WAIT + load.room(10), (
        f'{took:.1f} s, more than {2 + DUMP_WAIT + TERM_WAIT:.0f} s + {load.room(10):.1f} s; '
        f'{load}')

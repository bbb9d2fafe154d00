"""The room the timing tests give a busy machine (``process_state.Load``): it grows with the load
it measures, so that a bound of seconds holds on a loaded machine without going slack on a quiet
one."""
import subprocess
import sys

import pytest

from process_state import Load, cores


@pytest.mark.xdist_group('timing')  # conftest.TIMING: measures the CPU others take
def test_the_room_grows_when_more_processes_spin_than_there_are_cores():
    spinners = [subprocess.Popen([sys.executable, '-c', 'print("busy", flush=True)\n'
                                  'while True: pass'], stdout=subprocess.PIPE, text=True)
                for _ in range(cores() + 1)]
    try:
        assert all(s.stdout.readline() == 'busy\n' for s in spinners)  # they all run
        load = Load()
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    # one more busy process than cores, and the probe: each gets at most cores/(cores + 2)
    assert load.share < 0.8 and load.factor > 1.25, str(load)
    assert load.room(3) == pytest.approx(3 * load.factor)
    said = str(load)
    assert said.startswith("this machine's load: a busy thread got ") and \
        f'on {load.cores} core(s): room scaled by {load.factor:.1f}' in said


def test_the_room_is_never_less_than_a_quiet_machines():
    load = Load()
    assert load.factor >= 1.0 and load.room(2) >= 2.0

"""No process outlives its job: every child the programs start ends with its parent
(``gluon_multigpu.base.signals.dying_with_parent``), however the parent ends.

The doctor's probe is killed with the doctor in tests/training/test_doctor.py, the launcher's
agents and workers with the launcher in tests/launch/test_distributed.py; each parent killed as
its children start (launcher, agent's keeper, doctor) in tests/launch/test_launch_hostile.py and
test_doctor.py, every process found by the mark its tree inherits (``process_state.marked``).
"""
import ast
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, alive, children, wait_bounded
from process_state import wait_until

#: A parent that starts ``sleep`` as the package starts its children, then waits for ever.
PARENT = textwrap.dedent('''
    import os, subprocess, sys, time
    from gluon_multigpu.base import signals
    parent = os.getpid()

    def until_orphaned():  # in the child: the parent is killed meanwhile (the test does it)
        deadline = time.monotonic() + 120
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.01)

    first = until_orphaned if sys.argv[1] == 'late' else None
    subprocess.Popen(['sleep', '3600.{}'.format(parent)],
                     preexec_fn=signals.dying_with_parent(first=first))
    print('started', flush=True)
    time.sleep(3600)
''')


def start_parent(how):
    return subprocess.Popen([sys.executable, '-c', PARENT, how], stdout=subprocess.PIPE,
                            text=True, cwd=REPO, stdin=subprocess.DEVNULL)


def kill_left(pids):
    """SIGKILL what a failed test found left (not left by it too)."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_ends_when_its_parent_is_killed():
    parent = start_parent('now')
    child = None
    try:
        assert parent.stdout.readline() == 'started\n'  # Popen returns once the child has exec'd
        child, = children(parent.pid)
        parent.kill()
        assert wait_bounded(parent, 60) == -signal.SIGKILL
        wait_until(None, 'the child ended with its parent', lambda: not alive(child), 60)
    finally:
        parent.kill()
        parent.wait()
        kill_left([child] if child else [])


def test_a_child_whose_parent_died_before_it_asked_ends_at_once():
    # The parent is killed while its child is between fork and exec, before it asks the kernel:
    # the kernel would never tell it, so it must see for itself that its parent is gone.
    parent = start_parent('late')
    child = None
    try:
        wait_until(parent, 'the child forked', lambda: children(parent.pid), 60)
        child, = children(parent.pid)
        parent.kill()
        assert wait_bounded(parent, 60) == -signal.SIGKILL
        wait_until(None, 'the orphaned child ended', lambda: not alive(child), 180)
    finally:
        parent.kill()
        parent.wait()
        kill_left([child] if child else [])


#: The calls that start a process.
STARTS = {('subprocess', name) for name in ('Popen', 'run', 'call', 'check_call', 'check_output')}
FORBIDDEN = {('os', name) for name in ('fork', 'forkpty', 'system', 'popen', 'posix_spawn',
                                       'posix_spawnp', 'spawnv', 'spawnl', 'execv', 'execvp')}
#: (module, function) -> why a child started there may go without ``preexec_fn``.
ENDED_OTHERWISE = {
    ('gluon_multigpu/multihost/agent.py', 'start'):
        "the keeper watches the agent's socket and ends its command's tree, then itself, when "
        'the agent is gone',
}


def starts_in(path):
    """(function, call node) of each call in ``path`` that starts a process."""
    tree = ast.parse(path.read_text(encoding='utf-8'))
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and \
                    isinstance(child.func.value, ast.Name):
                found.append((function, (child.func.value.id, child.func.attr), child))
            visit(child, function)
    visit(tree, None)
    return found


def unguarded(path, where):
    """The calls of ``path`` (``where`` in the package) that start a process without asking for
    its end with its parent, as 'where:line call (its preexec_fn)'; and whether it starts any."""
    bad, starts = [], False
    for function, call, node in starts_in(path):
        if call in FORBIDDEN:
            bad.append(f'{where}:{node.lineno} {".".join(call)} (not through subprocess)')
        if call not in STARTS:
            continue
        starts = True
        if (where, function) in ENDED_OTHERWISE:
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        value = ast.unparse(keywords['preexec_fn']) if 'preexec_fn' in keywords else ''
        if 'dying_with_parent' not in value and '_die_with_parent' not in value:
            bad.append(f'{where}:{node.lineno} {".".join(call)} ({value or "no preexec_fn"})')
    return bad, starts


#: The code of the programs: the package's, and the lab's that scripts/ starts.
PROGRAMS_CODE = ('gluon_multigpu', 'lab/commands', 'lab/studies')


def test_every_process_the_programs_start_ends_with_its_parent():
    seen, bad = set(), []
    for path in sorted(p for folder in PROGRAMS_CODE for p in (REPO / folder).rglob('*.py')):
        where = path.relative_to(REPO).as_posix()
        found, starts = unguarded(path, where)
        bad += found
        if starts:
            seen.add(where)
    assert not bad, bad
    # the scan saw the package's starts: the doctor's probe, the launcher's, the agent's
    assert {'gluon_multigpu/doctor.py', 'gluon_multigpu/multihost/plan.py',
            'gluon_multigpu/multihost/agent.py', 'lab/commands/inflight.py'} <= seen, seen
    for module in ('gluon_multigpu/multihost/plan.py', 'lab/studies/failover_run.py'):
        # what their _die_with_parent is
        assert 'return signals.dying_with_parent(' in (REPO / module).read_text('utf-8')


@pytest.mark.parametrize('text, why', [
    ('subprocess.Popen(["x"])', 'no preexec_fn'),
    ('subprocess.run(["x"], preexec_fn=os.setpgrp)', 'os.setpgrp'),
    ('os.system("x")', 'not through subprocess'),
])
def test_the_scan_finds_a_start_without_the_request(tmp_path, text, why):
    path = tmp_path / 'm.py'
    path.write_text(f'import os, subprocess\n\ndef f():\n    {text}\n')
    bad, _ = unguarded(path, 'm.py')
    assert len(bad) == 1 and bad[0].startswith('m.py:4 ') and f'({why})' in bad[0], bad
    path.write_text('import subprocess\nfrom gluon_multigpu.base import signals\n\n'
                    'subprocess.run(["x"], preexec_fn=signals.dying_with_parent())\n')
    assert unguarded(path, 'm.py') == ([], True)

"""The launcher under hostile inputs and endings: process trees, host files, worker output."""
import io
import os
import random
import re
import signal
import subprocess
import sys

import pytest

from conftest import REPO, alive, children, descendants, wait_bounded
from process_state import MARK, cmdline, marked, wait_until
from gluon_multigpu.multihost import agent

LAUNCH = str(REPO / 'scripts' / 'launch.py')


def _with_arg(token):
    """The pids of the processes whose command line holds ``token`` (from /proc)."""
    found = []
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open(f'/proc/{name}/cmdline', 'rb') as f:
                    if token.encode() in f.read().split(b'\0'):
                        found.append(int(name))
            except OSError:
                pass
    return [p for p in found if alive(p)]


def test_sigkill_of_the_local_launcher_ends_grandchildren_and_daemons():
    child, daemon = f'300.{random.randrange(10**6)}', f'301.{random.randrange(10**6)}'
    # A grandchild in the role's session, and a double-forked daemon in a session of its own.
    script = f'sleep {child} & (setsid sleep {daemon} &); wait'
    proc = subprocess.Popen([sys.executable, LAUNCH, '-n', '1', '-s', '1', '--launcher', 'local',
                             '--', 'bash', '-c', script], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(None, 'the job started', lambda: _with_arg(child) and _with_arg(daemon), 120)
        tree = descendants(proc.pid)
    finally:
        proc.kill()
        wait_bounded(proc)
    _none_left(child, daemon, tree, 'every process of the job ended', 60)


def _none_left(child, daemon, tree, what, timeout):
    """Wait until no sleep of ``tree_script`` and no process of ``tree`` is left (those left
    then are killed, and the test fails)."""
    left = lambda: _with_arg(child) + _with_arg(daemon) + [p for p in tree if alive(p)]  # noqa: E731
    try:
        wait_until(None, what, lambda: not left(), timeout)
    finally:
        for pid in left():
            os.kill(pid, signal.SIGKILL)


def tree_script(tag):
    """A worker's shell command that starts a child in its session and a double-forked daemon
    in a session of its own, then waits; the sleeps' arguments, each found by ``_with_arg``."""
    child, daemon = f'{tag}1.{random.randrange(10**6)}', f'{tag}2.{random.randrange(10**6)}'
    return f'sleep {child} & (setsid sleep {daemon} &); echo ready; wait', child, daemon


def test_sigkill_of_a_workers_agent_ends_its_whole_tree_and_stops_the_job():
    script, child, daemon = tree_script(302)
    proc = subprocess.Popen([sys.executable, LAUNCH, '-n', '1', '-s', '1', '--launcher', 'local',
                             '--', 'bash', '-c', script], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(proc, 'the job started', lambda: _with_arg(child) and _with_arg(daemon), 120)
        agent_pid, = [p for p in children(proc.pid) if p in _with_arg(script)]
        tree = descendants(agent_pid)  # its keeper, bash, the two sleeps
        os.kill(agent_pid, signal.SIGKILL)
        status = wait_bounded(proc, 60)
    finally:
        proc.kill()
    _none_left(child, daemon, tree, 'every process of the worker ended', 10)
    err = proc.stderr.read()
    assert status == 1 and re.search(r'^launch: worker 0@127\.0\.0\.1 its agent ended \(signal '
                                     r'SIGKILL\); stopping the job$', err, re.M), err


def _launch_marked(tag, script):
    """The local launcher of one worker and one server running ``bash -c script``; every
    process of its tree carries ``MARK=tag``."""
    return subprocess.Popen([sys.executable, LAUNCH, '-n', '2', '-s', '1', '--launcher', 'local',
                             '--', 'bash', '-c', script], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **{MARK: tag}))


def _none_marked(tag, what, timeout=60):
    """Wait until no process carries ``MARK=tag`` (those left then are killed, and it fails)."""
    try:
        wait_until(None, what, lambda: not marked(tag), timeout)
    finally:
        for pid in marked(tag):
            os.kill(pid, signal.SIGKILL)


# the job's full tree is 17 processes: the launcher; 4 agents, their keepers and commands; the
# two workers' sleeps (one a daemon in a session of its own)
@pytest.mark.parametrize('started', [2, 4, 7, 11, 15])
def test_sigkill_of_the_launcher_while_it_starts_its_job_leaves_no_process(started):
    # Killed as soon as `started` processes of its tree exist: one is often just forked, and
    # must end although it asks for its end only after the kill.
    tag = f'{started}.{random.randrange(10**9)}'
    proc = _launch_marked(tag, 'sleep 3000 & (setsid sleep 3001 &); wait')
    try:
        wait_until(proc, f'{started} processes of the launch', lambda: len(marked(tag)) >= started,
                   120, interval=0)
    finally:
        proc.kill()
        wait_bounded(proc)
    _none_marked(tag, 'every process of the launch ended')


def test_sigkill_of_a_workers_keeper_ends_its_tree_and_stops_the_job():
    tag = str(random.randrange(10**9))
    script, child, daemon = tree_script(303)
    proc = _launch_marked(tag, script)
    try:
        def keepers():
            return [p for p in marked(tag) if p in _with_arg(script) and '--keeper' in cmdline(p)]
        # a keeper for each worker: on a busy machine the second may start after the first's tree
        wait_until(proc, 'the job started, a keeper for each worker',
                   lambda: _with_arg(child) and _with_arg(daemon) and len(keepers()) == 2, 120)
        keepers = keepers()
        assert len(keepers) == 2, keepers  # one for each worker
        os.kill(keepers[0], signal.SIGKILL)
        status = wait_bounded(proc, 60)
    finally:
        proc.kill()
    _none_marked(tag, 'every process of the job ended')
    err = proc.stderr.read()
    assert status == 1 and re.search(r'^launch: worker [01]@127\.0\.0\.1 failed \(signal '
                                     r'SIGKILL\); stopping the job$', err, re.M), err


def _launch_ssh(hostfile):
    proc = subprocess.run([sys.executable, LAUNCH, '-n', '1', '-s', '1', '--launcher', 'ssh',
                           '-H', str(hostfile), '--', 'true'], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize('content, message', [
    ('FIFO', 'is not a regular file'),
    ('/dev/zero', 'is not a regular file'),
    ('a' * 1_000_000 + '\n', 'line 1:'),
    ('host1\nhost2\nhost1\n', 'line 3: host host1 is already on line 1'),
    ('host1\nroot@host1\n', 'line 2: host host1 is already on line 1'),
    ('h\n' * 600_000, 'larger than 1 MiB'),
])
def test_hostile_host_files_are_one_line_and_status_2(content, message, tmp_path):
    path = tmp_path / 'hosts'
    if content == 'FIFO':
        os.mkfifo(path)
    elif content.startswith('/dev/'):
        path = content
    else:
        path.write_text(content)
    status, out, err = _launch_ssh(path)
    assert status == 2 and out == '' and len(err.splitlines()) == 1 and message in err, err
    assert 'Traceback' not in err


def test_a_long_line_is_cut_with_a_marker_in_bounded_memory():
    stream = io.BytesIO(b'x' * 1_000_000 + b'\nnext\n')
    assert agent.read_line(stream, 100) == (b'x' * 100, 1_000_000 - 100)
    assert agent.read_line(stream, 100) == (b'next', 0)
    assert agent.read_line(stream, 100) is None


def test_an_agent_input_line_over_the_bound_is_ignored_with_a_note():
    out = io.BytesIO()
    a = agent.Agent(['true'], out=out, inp=io.BytesIO(b'k' * (10 * agent.INPUT_LIMIT) + b'\n'))
    a._listen()  # pylint: disable=protected-access
    assert a.launcher_gone
    assert f'ignored an input line over {agent.INPUT_LIMIT} bytes'.encode() in out.getvalue()


WORKER = ("import sys; print('x' * 200000); print('\\x1egm exit 0'); "
          "print('\\x1egm step 99'); print('\\x1b[2Jcleared'); sys.exit(3)")


def test_a_worker_cannot_forge_control_lines_or_reach_the_terminal_raw():
    proc = subprocess.run([sys.executable, LAUNCH, '-n', '1', '-s', '1', '--launcher', 'local',
                           '--', sys.executable, '-c', WORKER], capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout
    assert '\x1b' not in out and '\x1e' not in out
    assert '^^gm exit 0' in out and '^^gm step 99' in out and '^[[2Jcleared' in out, out[-2000:]
    cut = agent.LINE_LIMIT
    assert 'x' * cut + f' ... [line cut: {200000 - cut} bytes more]' in out
    # The forged "exit 0" changed nothing: the worker's own status 3 is what the launcher saw.
    assert proc.returncode == 1 and 'failed (status 3)' in proc.stderr, proc.stderr


def test_an_agent_holds_its_port_while_it_lives():
    # The scheduler's agent takes the port's mark before it starts the scheduler and keeps it to
    # its end: a second launch on that port meanwhile is refused (the mark is a socket the
    # agent must keep referenced; dropped, it closed at once and the port was free again).
    import socket
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]

    def taken():  # a second holder of the port is refused (its own mark let go at once)
        mark = agent.hold_port(port)
        if mark is not None:
            mark.close()
        return mark is None
    proc = subprocess.Popen([sys.executable, '-m', 'gluon_multigpu.multihost.agent', '--hold-port',
                             str(port), '--', 'sleep', '60'], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(proc, 'the agent held its port', taken, timeout=60, interval=0.2)
        assert taken() and proc.poll() is None
    finally:
        proc.stdin.close()  # the launcher gone: the agent ends its command and itself
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()


def test_a_port_taken_between_check_and_start_is_one_line_for_the_loser():
    import socket
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    # The winner's scheduler agent holds the port's mark, as a launch on the port at once would.
    winner = agent.hold_port(port)
    assert winner is not None and agent.hold_port(port) is None
    try:
        proc = subprocess.run([sys.executable, LAUNCH, '-n', '1', '-s', '1', '--port', str(port),
                               '--', 'true'], capture_output=True, text=True, timeout=120)
    finally:
        winner.close()
    err = proc.stderr
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert f'port {port} on 127.0.0.1 was taken after the check' in err and '--port' in err

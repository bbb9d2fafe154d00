"""One process of a launched job, on its host: it runs the command, relays it, and ends it.

``launch`` starts every role of a job through an agent, here or over ssh, as ``python -m
gluon_multigpu.multihost.agent [--heartbeat S] [--timeout S] [--grace S] -- COMMAND``. The
agent runs COMMAND under a keeper (``keep``: this module with ``--keeper``) that ends COMMAND's
whole tree should the agent die, even by SIGKILL. It copies COMMAND's output (lines cut at
``LINE_LIMIT``, control characters shown as ``^X``) and adds lines that begin with ``CONTROL``
for the launcher (``beat`` every ``--heartbeat`` seconds, ``beat stopped`` while COMMAND is
stopped, ``step N``, ``held N``, ``rest``, ``watch``, ``stall S``, ``rank R W``, ``exit
STATUS``); it takes the launcher's lines (``ping``, ``stop-ask``, ``stop-at S``, ``term``,
``kill``, ``dump``) on its standard input, and ends COMMAND (SIGTERM, SIGKILL ``--grace``
seconds later) when that closes or is silent for ``--timeout`` seconds: status
``LAUNCHER_GONE``, else COMMAND's (128 + a signal). ``--check`` runs nothing: one JSON line,
whether COMMAND's program (and a ``--port``) is available here.
"""
import argparse
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ..base import signals, stacks
from ..base.protocol import CONTROL, CONTROL_VARIABLE, control_fds

#: Exit status when the launcher was gone and the agent ended the command.
LAUNCHER_GONE = 124
#: The longest line of the command's output relayed whole; the rest is cut, with a marker.
LINE_LIMIT = 64 * 1024
#: The longest line the agent takes from the launcher; a longer one is ignored, with a note.
INPUT_LIMIT = 4096
#: Exit status when ``--hold-port`` found the port taken (by another launch or anything else).
PORT_TAKEN = 125
_PR_SET_CHILD_SUBREAPER = 36


def hold_port(port):
    """A socket that marks TCP ``port`` as this job's on this host, or None if it is taken.

    An abstract Unix socket named after the port: binding it is exclusive, and it goes with the
    process, so two launches on one port at once cannot both pass; the TCP port is then checked
    free too (anything else may have taken it since the launcher's check).
    """
    mark, bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), False
    with contextlib.suppress(OSError):
        mark.bind(f'\0gluon-multigpu-port-{port}')
        bound = True
    if bound and 'error' not in check([], port):
        return mark
    mark.close()
    return None
#: Control characters made visible (``^[`` for ESC), all but tab; ``\x1e`` so none forges CONTROL.
_VISIBLE = {c: '^' + chr(c ^ 64) for c in (*range(32), 127) if c != 9}


def visible(text):
    """``text`` with every control character but tab shown as ``^X`` (ESC as ``^[``)."""
    return text.translate(_VISIBLE)


def shown(read):
    """A line from ``read_line`` as it is relayed: control characters made visible, a cut line
    marked as such."""
    return visible(read[0].decode(errors='replace')) + (f' ... [line cut: {read[1]} bytes more]'
                                                         if read[1] else '')


def read_line(stream, limit):
    """The next line of ``stream`` (bytes, without its newline) and how many bytes were cut.

    At most ``limit`` bytes are kept; the rest of a longer line is read and dropped in pieces, so
    memory stays bounded. Returns ``None`` at the end of the stream.
    """
    if not (line := stream.readline(limit)):
        return None
    if line.endswith(b'\n'):
        return line[:-1], 0
    cut = 0
    while (more := stream.readline(limit)) and not more.endswith(b'\n'):
        cut += len(more)
    return line, cut + max(len(more) - 1, 0)  # the newline that ends the line is not counted


def _stat(pid):
    """The fields of ``/proc/PID/stat`` after the program's name (bytes: state, parent, ...);
    an empty list once the process is gone."""
    with contextlib.suppress(OSError, IndexError), open(f'/proc/{pid}/stat', 'rb') as f:
        return f.read().rsplit(b')', 1)[1].split()
    return []


def _descendants(pid):
    """Every process below ``pid`` (from /proc): children, theirs, and so on."""
    parents = {}
    for name in filter(str.isdigit, os.listdir('/proc')):
        if len(fields := _stat(name)) > 1:
            parents.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        found += (kids := parents.get(todo.pop(), []))
        todo += kids
    return found


def _subreaper():
    """Make this process the subreaper of its descendants: an orphan below comes back to it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def agent_argv(extra, command):
    """The command that runs ``command`` under an agent given the options ``extra`` (under a
    keeper, ``keep``, with ``--keeper``)."""
    return [sys.executable, '-m', 'gluon_multigpu.multihost.agent', *extra, '--', *command]


def keep(link, command):
    """The keeper between the agent and ``command`` (the module's text): run it with its control
    pipes (``CONTROL_VARIABLE``: the keeper's own are closed), tell the agent its pid on ``link``,
    end its whole tree when it ends or when ``link`` closes (the agent is gone); return (or end
    by) the command's status."""
    try:
        link = socket.socket(fileno=link)
    except OSError as e:  # an option of the agent's own, not for people: one line all the same
        print(f'error: descriptor {link} is not the agent\'s socket for a keeper ({e.strerror})',
              file=sys.stderr)
        return 2
    _subreaper()
    fds = control_fds() or ()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    # SIGCHLD wakes the wait below; a stop signal reaches the command's session from the agent.
    signals.install(lambda signum, frame: None, (signal.SIGCHLD, *signals.STOP_SIGNALS),
                    nohup=False)
    try:
        # SIGKILL when the keeper dies (Linux); its session is its own
        proc = subprocess.Popen(command, start_new_session=True, pass_fds=fds,
                                preexec_fn=signals.dying_with_parent(signal.SIGKILL))
    except OSError as e:
        with contextlib.suppress(OSError):
            link.sendall(f'error {e.strerror or e}\n'.encode())
        return 127
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        link.sendall(f'pid {proc.pid}\n'.encode())
    while proc.returncode is None:
        ready = select.select([link, wake_r], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        # the agent is gone (its end closed), else the process is reaped, if it ended
        proc.returncode = LAUNCHER_GONE if link in ready and not _heard(link) else _reaped(proc.pid)
    _end_tree(proc.pid)
    return _end_as(proc.returncode)


def _heard(link):
    """What the agent sent on ``link`` (b'' once it is gone)."""
    with contextlib.suppress(OSError):
        return link.recv(4096)
    return b''


def _reaped(pid):
    """Reap every ended child; the exit code of ``pid`` (``-N``: signal N) if it ended, or None."""
    with contextlib.suppress(ChildProcessError):
        while (done := os.waitpid(-1, os.WNOHANG))[0]:
            if done[0] == pid:  # as os.waitstatus_to_exitcode (Python 3.9) says it
                return -os.WTERMSIG(done[1]) if os.WIFSIGNALED(done[1]) else os.WEXITSTATUS(done[1])
    return None


def _signal(signum, group=None, below=True):
    """Send ``signum`` to every process of the session ``group`` (if any); with ``below``, to
    every process below this one too (daemons that left the session come back to it as their
    subreaper)."""
    if group is not None:
        with contextlib.suppress(OSError):
            os.killpg(group, signum)
    for pid in _descendants(os.getpid()) if below else ():
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _end_tree(group):
    """SIGKILL the session ``group`` and every process below this one, until none is left (each
    orphan comes back to this process, the subreaper, and is ended in its turn)."""
    _signal(signal.SIGKILL, group)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        _signal(signal.SIGKILL)


def _end_as(code):
    """``code`` if it is an exit status; else end this process by the same signal (no core)."""
    if code >= 0:
        return code
    with contextlib.suppress(OSError, ValueError):
        import resource  # pylint: disable=import-outside-toplevel
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        signals.install(signal.SIG_DFL, (-code,), nohup=False)
    os.kill(os.getpid(), -code)
    return 128 - code


#: The path a program name runs as here (on the PATH, or a path from the current folder), or None.
find_program = shutil.which


def check(command, port=None):
    """The ``--check`` answer as a dict: ``error`` (a line) or ``ok``, and ``port``."""
    if command and find_program(command[0]) is None:
        return {'error': f'the command {command[0]} is not a program on this host '
                f'({socket.gethostname()}, in {os.getcwd()})'}
    if port is None:
        return {'ok': True}
    with socket.socket() as s:
        try:
            s.bind(('', port))
        except OSError as e:
            return {'error': f'port {port} is in use ({e.strerror})'}
        return {'ok': True, 'port': s.getsockname()[1]}


class Agent:
    """Runs ``command`` and relays it to the launcher (see the module's text)."""

    def __init__(self, command, heartbeat=2.0, timeout=15.0, grace=5.0, out=None, inp=None):
        self.command, self.heartbeat, self.timeout, self.grace = command, heartbeat, timeout, grace
        self.out, self.inp = out or sys.stdout.buffer, inp or sys.stdin.buffer
        self.lock, self.heard, self.launcher_gone = threading.Lock(), time.monotonic(), False
        # the keeper; the command's pid; the socket to it; the command's control pipe
        self.proc = self.pid = self._link = self._to_job = None
        _subreaper()  # daemonised descendants come back to the agent, which can then end them all

    def say(self, message):
        """Write one control line (quietly nothing once the launcher's end is closed)."""
        self.write((CONTROL + message + '\n').encode())

    def write(self, data):
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.out.write(data)
            self.out.flush()

    def start(self):
        """Start the command under its keeper with its control pipes; return why it cannot
        (None once it runs)."""
        (to_job_r, to_job_w), (from_job_r, from_job_w) = os.pipe(), os.pipe()
        self._link, theirs = socket.socketpair()
        env = {'PYTHONUNBUFFERED': '1', **os.environ, CONTROL_VARIABLE: f'{to_job_r},{from_job_w}'}
        try:
            self.proc = subprocess.Popen(
                agent_argv(['--keeper', str(theirs.fileno())], self.command),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True, pass_fds=(to_job_r, from_job_w, theirs.fileno()))
        except OSError as e:
            return e.strerror or e
        finally:
            os.close(to_job_r)
            os.close(from_job_w)
            theirs.close()
        reply = read_line(self._link.makefile('rb'), INPUT_LIMIT)  # 'pid N' or 'error WHY'
        kind, _, said = reply[0].decode(errors='replace').partition(' ') if reply else ('', '', '')
        if kind != 'pid':
            self._relay_output()  # what the keeper wrote, if it could not start
            return said if kind == 'error' else f'its keeper ended (status {self.proc.wait()})'
        self.pid, self._to_job = int(said), os.fdopen(to_job_w, 'w', buffering=1)
        self.say(f'started {self.pid}')
        self._output = threading.Thread(target=self._relay_output, daemon=True)
        self._output.start()
        threading.Thread(target=self._relay_control, args=(from_job_r,), daemon=True).start()
        threading.Thread(target=self._listen, daemon=True).start()
        return None

    def _relay_output(self):
        """Relay the command's lines, control characters made visible, long ones cut."""
        while (read := read_line(self.proc.stdout, LINE_LIMIT)) is not None:
            self.write((shown(read) + '\n').encode())

    def _relay_control(self, fd):
        with os.fdopen(fd, 'rb') as f:
            while (read := read_line(f, INPUT_LIMIT)) is not None:
                if not read[1]:
                    self.say(visible(read[0].decode(errors='replace').strip()))

    def _listen(self):
        while (read := read_line(self.inp, INPUT_LIMIT)) is not None:
            self.heard = time.monotonic()
            if read[1]:
                self.write(f'agent: ignored an input line over {INPUT_LIMIT} bytes\n'.encode())
                continue
            words = read[0].decode(errors='replace').split() or ['']  # a blank line: nothing
            if words[0] in ('stop-ask', 'stop-at') and self._to_job is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._to_job.write(' '.join(words) + '\n')
            elif words[0] in ('term', 'kill'):  # the command's session, not what left it
                _signal(signal.SIGTERM if words[0] == 'term' else signal.SIGKILL, self.pid, False)
            elif words[0] == 'dump':  # a hung job: the stacks of the processes that write them
                stacks.send_dump(_descendants(os.getpid()))
        self.launcher_gone = True

    def run(self):
        """Supervise the command until it ends or the launcher is gone; return the exit status."""
        if (why := self.start()) is not None:
            self.write(f'could not start {self.command[0]}: {why}\n'.encode())
            self.say('exit 127')
            return 127
        next_beat = 0.0
        while True:
            if (code := self.proc.poll()) is not None:
                _signal(signal.SIGKILL, self.pid)  # whatever the command left
                self._output.join(timeout=2)  # its last lines before the exit line
                status = 128 - code if code < 0 else code
                self.say(f'exit {status}')
                return status
            now = time.monotonic()
            if self.launcher_gone or now - self.heard > self.timeout:
                # SIGTERM the command's session, SIGKILL what is left after the grace period
                _signal(signal.SIGTERM, self.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=self.grace)
                _signal(signal.SIGKILL, self.pid)
                self.proc.wait()
                return LAUNCHER_GONE
            if now >= next_beat:
                self.say('beat stopped' if _stat(self.pid)[:1] in ([b'T'], [b't']) else 'beat')
                next_beat = now + self.heartbeat
            time.sleep(0.1)


def build_parser():
    p = argparse.ArgumentParser(prog='python -m gluon_multigpu.multihost.agent',
                                description=__doc__.splitlines()[0])
    for name, default in (('--heartbeat', 2.0), ('--timeout', 15.0), ('--grace', 5.0)):
        p.add_argument(name, type=float, default=default)
    p.add_argument('--check', action='store_true')
    p.add_argument('--port', type=int)
    p.add_argument('--hold-port', type=int, help='take this port for the job before starting '
                   '(the scheduler); exit with PORT_TAKEN if another holds it')
    p.add_argument('--keeper', type=int, help=argparse.SUPPRESS)  # keep(): the socket's fd
    p.add_argument('command', nargs=argparse.REMAINDER)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if args.keeper is not None:
        return keep(args.keeper, command)
    if args.check:
        print(json.dumps(answer := check(command, args.port)), flush=True)
        return 0 if 'ok' in answer else 2
    # The launcher stops the job through the agent's input; a signal to the agent itself
    # (its ssh session closing, a kill) ends the job as the launcher's going would.
    agent = Agent(command, args.heartbeat, args.timeout, args.grace)
    # the mark holds the port while this process lives: keep the socket referenced
    held = hold_port(args.hold_port) if args.hold_port is not None else True
    if held is None:
        agent.say(f'exit {PORT_TAKEN}')
        return PORT_TAKEN
    signals.install(lambda signum, frame: setattr(agent, 'launcher_gone', True),
                    (signal.SIGTERM, signal.SIGHUP, signal.SIGINT), nohup=False)
    signals.ignore((signal.SIGPIPE,))
    return agent.run()


if __name__ == '__main__':
    # os._exit: a thread still reads the launcher's lines, and Python's shutdown would wait on it.
    status = main()
    sys.stdout.flush()
    os._exit(status)  # pylint: disable=protected-access

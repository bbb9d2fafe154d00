"""One process of a launched job, on its host: it runs the command, relays it, and ends it.

``launch`` starts every role of a parameter-server job (scheduler, servers,
workers) through an agent, on this machine or over ssh, as
``python -m gluon_multigpu.multihost.agent [options] -- COMMAND``. The agent

More in docs/design.md, "Notes on the code".
"""
import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ..base import signals
from ..base.protocol import CONTROL, CONTROL_VARIABLE

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
    mark = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        mark.bind(f'\0gluon-multigpu-port-{port}')
    except OSError:
        mark.close()
        return None
    if 'error' in check([], port):
        mark.close()
        return None
    return mark
#: Control characters made visible (``^[`` for ESC), all but tab; ``\x1e`` so none forges CONTROL.
_VISIBLE = {c: '^' + chr(c + 64) for c in range(32) if c != 9}
_VISIBLE[127] = '^?'


def visible(text):
    """``text`` with every control character but tab shown as ``^X`` (ESC as ``^[``)."""
    return text.translate(_VISIBLE)


def read_line(stream, limit):
    """The next line of ``stream`` (bytes, without its newline) and how many bytes were cut.

    At most ``limit`` bytes are kept; the rest of a longer line is read and dropped in pieces, so
    memory stays bounded. Returns ``None`` at the end of the stream.
    """
    line = stream.readline(limit)
    if not line:
        return None
    if line.endswith(b'\n'):
        return line[:-1], 0
    cut = 0
    while True:
        more = stream.readline(limit)
        if not more:
            return line, cut
        if more.endswith(b'\n'):
            return line, cut + len(more) - 1
        cut += len(more)


def _descendants(pid):
    """Every process below ``pid`` (from /proc): children, theirs, and so on."""
    parents = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open(f'/proc/{name}/stat', 'rb') as f:
                    parents.setdefault(int(f.read().rsplit(b')', 1)[1].split()[1]), []).append(
                        int(name))
            except (OSError, IndexError, ValueError):
                pass
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def on_parent_death(signum):
    """In a child before it runs its program: ``signum`` when its parent dies (Linux's
    ``PR_SET_PDEATHSIG``; nothing where there is none)."""
    try:
        ctypes.CDLL(None).prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _die_with_parent():
    """In the child: SIGKILL when the agent dies (Linux); its session is its own
    (``start_new_session``)."""
    on_parent_death(signal.SIGKILL)


def find_program(name):
    """The path ``name`` runs as here (on the PATH, or a path from the current folder), or None."""
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name)


def check(command, port=None):
    """The ``--check`` answer as a dict: ``error`` (a line) or ``ok``, and ``port``."""
    if command and find_program(command[0]) is None:
        return {'error': f'the command {command[0]} is not a program on this host '
                f'({socket.gethostname()}, in {os.getcwd()})'}
    answer = {'ok': True}
    if port is not None:
        with socket.socket() as s:
            try:
                s.bind(('', port))
            except OSError as e:
                return {'error': f'port {port} is in use ({e.strerror})'}
            answer['port'] = s.getsockname()[1]
    return answer


def _state(pid):
    """The one-letter state of process ``pid`` (``/proc``), or None once it is gone."""
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            return f.read().rsplit(b')', 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


class Agent:
    """Runs ``command`` and relays it to the launcher (see the module's text)."""

    def __init__(self, command, heartbeat=2.0, timeout=15.0, grace=5.0, out=None, inp=None):
        self.command, self.heartbeat, self.timeout, self.grace = command, heartbeat, timeout, grace
        self.out = out or sys.stdout.buffer
        self.inp = inp or sys.stdin.buffer
        self.lock = threading.Lock()
        self.heard = time.monotonic()
        self.launcher_gone = False
        self.proc = None
        self._to_job = None
        try:  # daemonised descendants come back to the agent, which can then end them all
            ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1)
        except (OSError, AttributeError):
            pass

    def say(self, message):
        """Write one control line (quietly nothing once the launcher's end is closed)."""
        self.write((CONTROL + message + '\n').encode())

    def write(self, data):
        with self.lock:
            try:
                self.out.write(data)
                self.out.flush()
            except (OSError, ValueError):
                pass

    def start(self):
        """Start the command with its control pipes; return False (and say why) if it cannot."""
        to_job_r, to_job_w = os.pipe()
        from_job_r, from_job_w = os.pipe()
        env = dict(os.environ, PYTHONUNBUFFERED=os.environ.get('PYTHONUNBUFFERED', '1'))
        env[CONTROL_VARIABLE] = f'{to_job_r},{from_job_w}'
        try:
            self.proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                pass_fds=(to_job_r, from_job_w), preexec_fn=_die_with_parent)
        except OSError as e:
            self.write(f'could not start {self.command[0]}: {e.strerror or e}\n'.encode())
            return False
        finally:
            os.close(to_job_r)
            os.close(from_job_w)
        self._to_job = os.fdopen(to_job_w, 'w', buffering=1)
        self.say(f'started {self.proc.pid}')
        self._output = threading.Thread(target=self._relay_output, daemon=True)
        self._output.start()
        threading.Thread(target=self._relay_control, args=(from_job_r,), daemon=True).start()
        threading.Thread(target=self._listen, daemon=True).start()
        return True

    def _relay_output(self):
        """Relay the command's lines, control characters made visible, long ones cut."""
        while (read := read_line(self.proc.stdout, LINE_LIMIT)) is not None:
            line, cut = read
            text = visible(line.decode(errors='replace'))
            if cut:
                text += f' ... [line cut: {cut} bytes more]'
            self.write((text + '\n').encode())

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
            words = read[0].decode(errors='replace').split()
            if not words:
                continue
            if words[0] == 'stop-at' and self._to_job is not None:
                try:
                    self._to_job.write(' '.join(words) + '\n')
                except (OSError, ValueError):
                    pass
            elif words[0] in ('term', 'kill'):
                self.signal(signal.SIGTERM if words[0] == 'term' else signal.SIGKILL)
        self.launcher_gone = True

    def signal(self, signum, everything=False):
        """Send ``signum`` to every process of the command's session; with ``everything``, to
        every process below the agent too (daemons that left the session come back to it as
        their subreaper)."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in _descendants(os.getpid()) if everything else ():
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def end(self):
        """SIGTERM the command's session, SIGKILL what is left after the grace period."""
        self.signal(signal.SIGTERM, everything=True)
        try:
            self.proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL, everything=True)
        self.proc.wait()

    def run(self):
        """Supervise the command until it ends or the launcher is gone; return the exit status."""
        if not self.start():
            self.say('exit 127')
            return 127
        next_beat = 0.0
        while True:
            code = self.proc.poll()
            if code is not None:
                self.signal(signal.SIGKILL, everything=True)  # whatever the command left
                self._output.join(timeout=2)  # its last lines before the exit line
                status = 128 - code if code < 0 else code
                self.say(f'exit {status}')
                return status
            now = time.monotonic()
            if self.launcher_gone or now - self.heard > self.timeout:
                self.end()
                return LAUNCHER_GONE
            if now >= next_beat:
                self.say('beat stopped' if _state(self.proc.pid) in ('T', 't') else 'beat')
                next_beat = now + self.heartbeat
            time.sleep(0.1)


def build_parser():
    p = argparse.ArgumentParser(prog='python -m gluon_multigpu.multihost.agent',
                                description=__doc__.splitlines()[0])
    p.add_argument('--heartbeat', type=float, default=2.0)
    p.add_argument('--timeout', type=float, default=15.0)
    p.add_argument('--grace', type=float, default=5.0)
    p.add_argument('--check', action='store_true')
    p.add_argument('--port', type=int)
    p.add_argument('--hold-port', type=int, help='take this port for the job before starting '
                   '(the scheduler); exit with PORT_TAKEN if another holds it')
    p.add_argument('command', nargs=argparse.REMAINDER)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if args.check:
        answer = check(command, args.port)
        print(json.dumps(answer), flush=True)
        return 0 if 'ok' in answer else 2
    # The launcher stops the job through the agent's input; a signal to the agent itself
    # (its ssh session closing, a kill) ends the job as the launcher's going would.
    agent = Agent(command, args.heartbeat, args.timeout, args.grace)
    held = hold_port(args.hold_port) if args.hold_port is not None else True
    if held is None:
        agent.say(f'exit {PORT_TAKEN}')
        return PORT_TAKEN

    def gone(signum, frame):  # pylint: disable=unused-argument
        agent.launcher_gone = True
    signals.install(gone, (signal.SIGTERM, signal.SIGHUP, signal.SIGINT), nohup=False)
    signals.ignore((signal.SIGPIPE,))
    return agent.run()


if __name__ == '__main__':
    # os._exit: a thread still reads the launcher's lines, and Python's shutdown would wait on it.
    status = main()
    sys.stdout.flush()
    os._exit(status)  # pylint: disable=protected-access

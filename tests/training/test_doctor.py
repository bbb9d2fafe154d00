"""The doctor in a hostile environment: killed while its probe loads MXNet, an MXNet whose import
hangs, a NumPy that cannot be imported.

Each MXNet or NumPy here is a fake package put first on the path (as a broken
install would be found), so that each case is met on any machine.
"""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from gluon_multigpu import doctor
from conftest import REPO, Lines, alive, children, run_bounded, wait_bounded
from process_state import MARK, cmdline, marked, wait_until

#: A fake ``mxnet`` whose import hangs: it writes its pid to the file $HANG_PID_FILE, then waits
#: for ever (as an MXNet stuck in its library's start).
HANGS = ('import os, pathlib, time\n'
         "pathlib.Path(os.environ['HANG_PID_FILE'] + '.part').write_text(str(os.getpid()))\n"
         "os.replace(os.environ['HANG_PID_FILE'] + '.part', os.environ['HANG_PID_FILE'])\n"
         'time.sleep(3600)\n')


def fake_package(folder, name, body, **extra):
    """The environment of a process that finds package ``name`` in ``folder``, whose import
    runs ``body``."""
    (folder / name).mkdir()
    (folder / name / '__init__.py').write_text(body)
    return {**os.environ, **extra, 'PYTHONPATH': os.pathsep.join(
        [str(folder), str(REPO)] + os.environ.get('PYTHONPATH', '').split(os.pathsep))}


def probe_pid(pid_file):
    return int(pid_file.read_text())


@pytest.mark.parametrize('signum', [signal.SIGKILL, signal.SIGTERM])
def test_the_doctor_killed_while_its_probe_hangs_leaves_no_process(tmp_path, signum):
    pid_file = tmp_path / 'probe.pid'
    env = fake_package(tmp_path, 'mxnet', HANGS, HANG_PID_FILE=str(pid_file))
    doctor = subprocess.Popen([sys.executable, '-m', 'gluon_multigpu.doctor'], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    probe = None
    try:
        err = Lines(doctor.stderr)
        # It says at once what it waits for, before the probe has even started MXNet's import.
        err.wait_for(r'^doctor: importing MXNet .*\(up to 300 s\)\.\.\.$', timeout=120)
        wait_until(doctor, 'the probe hangs in its import of MXNet', pid_file.exists, 120)
        probe = probe_pid(pid_file)
        assert probe in children(doctor.pid) and 'doctor.probe()' in cmdline(probe)
        doctor.send_signal(signum)
        # SIGKILL: nothing said; SIGTERM: one line saying so, and 128 + the signal
        assert wait_bounded(doctor, 60) == (-signum if signum == signal.SIGKILL else 128 + signum)
        wait_until(None, f'the probe (pid {probe}) ended with the doctor',
                   lambda: not alive(probe), 60)
        if signum != signal.SIGKILL:
            err.wait_ended()
            assert err.text()[-1] == \
                'doctor: interrupted by SIGTERM: stopped before its report'
    finally:
        doctor.kill()
        doctor.wait()
        probe = probe or (probe_pid(pid_file) if pid_file.exists() else None)
        if probe is not None and alive(probe) and 'doctor.probe()' in cmdline(probe):
            os.kill(probe, signal.SIGKILL)  # what the test found left: not left by it too


@pytest.mark.parametrize('signum', [signal.SIGKILL, signal.SIGTERM])
def test_the_doctor_killed_as_its_probe_starts_leaves_no_process(tmp_path, signum):
    # The moment the probe is forked (it may not have asked for its end with the doctor yet).
    tag = f'doctor.{os.getpid()}.{signum}'
    env = fake_package(tmp_path, 'mxnet', HANGS, HANG_PID_FILE=str(tmp_path / 'pid'),
                       **{MARK: tag})
    doctor = subprocess.Popen([sys.executable, '-m', 'gluon_multigpu.doctor'], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL)
    try:
        wait_until(doctor, 'the probe forked', lambda: len(marked(tag)) >= 2, 120, interval=0)
        doctor.send_signal(signum)
        assert wait_bounded(doctor, 60) in (-signum, 128 + signum)
        wait_until(None, 'every process of the doctor ended', lambda: not marked(tag), 60)
    finally:
        doctor.kill()
        doctor.wait()
        for pid in marked(tag):
            os.kill(pid, signal.SIGKILL)  # what the test found left: not left by it too


#: A fake ``mxnet`` whose import waits until the file $RELEASE_FILE exists, then fails.
RELEASED = ('import os, pathlib, time\n'
            "while not pathlib.Path(os.environ['RELEASE_FILE']).exists():\n"
            '    time.sleep(0.05)\n'
            "raise RuntimeError('released by the test')\n")


def test_the_doctor_says_what_its_probe_waits_for_while_it_waits(tmp_path):
    release = tmp_path / 'release'
    env = fake_package(tmp_path, 'mxnet', RELEASED, RELEASE_FILE=str(release))
    said = []

    def say(line):
        said.append(line)
        if sum('importing MXNet' in line for line in said) >= 2:
            release.touch()  # two lines named the import: let it fail
    # the deadline (300 s) is only reached if no line ever names the import
    found = doctor.run_probe(environ=env, timeout=300, every=0.2, say=say)
    assert found['loads'] is False and 'RuntimeError: released by the test' in found['error']
    seconds = []
    for line in said:
        match = re.fullmatch(r'doctor: still (starting Python|importing MXNet) \((\d+) s of 300 s\)'
                             r'\.\.\.', line)
        assert match, line
        seconds.append(int(match.group(2)))
    # two lines or more: the probe may say it once more before it notices the release
    assert seconds == sorted(seconds) and sum('importing MXNet' in line for line in said) >= 2


@pytest.mark.parametrize('body', [
    "raise ImportError('Importing the numpy C-extensions failed.')",
    "raise RuntimeError('module compiled against ABI version 0x1000009')",
])
def test_the_doctor_reports_a_numpy_that_cannot_be_imported(tmp_path, body):
    env = fake_package(tmp_path, 'numpy', body)
    proc = run_bounded([sys.executable, '-m', 'gluon_multigpu.doctor'], timeout=120, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert 'Traceback' not in proc.stdout + proc.stderr
    problems = [line for line in proc.stdout.splitlines() if line.startswith('problem')]
    assert len(problems) == 1 and 'NumPy cannot be imported' in problems[0], proc.stdout
    assert body.split("'")[1] in problems[0] and 'pip install --force-reinstall' in problems[0]
    assert 'numpy     does not import' in proc.stdout
    assert 'importing MXNet' not in proc.stderr  # no probe: MXNet imports NumPy
    as_json = run_bounded([sys.executable, '-m', 'gluon_multigpu.doctor', '--json'], timeout=120,
                          env=env)
    facts = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and facts['numpy']['version'] is None
    assert facts['problems'] == [problems[0][len('problem   '):]] and facts['probe'] is None

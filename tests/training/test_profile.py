"""A profile of chosen steps (``train``'s ``profile``, the script's --profile): MXNet's profiler
over exactly those steps, a trace with a track per device, the costliest operators, bad input."""
import collections
import errno
import io
import json
import os
import shutil
import signal
import sys
import threading

import pytest

import gluon_multigpu as gm
from gluon_multigpu.observe import profile as profiling
from gluon_multigpu.observe.profile import Profile
from gluon_multigpu.errors import GluonMultiGPUError, Interrupted
from gluon_multigpu.filesafety import foreign
from conftest import REPO, limited, load_script, run_bounded

import mxnet as mx
from mxnet.gluon import nn

BATCH, STEPS = 64, 4  # 256 images: 4 steps an epoch
DEVICES = ['cpu(0)', 'cpu(1)']
QUICK = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-train', '256', '--num-test', '64',
         '--batch-size', str(BATCH), '--synthetic', '--progress-interval', '0']


@pytest.fixture(scope='module')
def data():
    gm.cpu_devices(2)
    return gm.data.synthetic_data('fashion-mnist', BATCH, num_train=STEPS * BATCH, num_test=64,
                                  num_devices=2)


@pytest.fixture(scope='module')
def train_script():
    return load_script('train')


def convolutions(net):
    return sum(isinstance(layer, nn.Conv2D) for layer in net)


def operators(path):
    """``{(device, operator): calls}`` of the trace at ``path``, its processes by their names."""
    with open(path, encoding='utf-8') as f:
        trace = json.load(f)
    names = {e['pid']: e['args']['name'] for e in trace['traceEvents']
             if e.get('ph') == 'M' and e['name'] == 'process_name'}
    return collections.Counter((names[e['pid']], e['name']) for e in trace['traceEvents']
                               if e.get('ph') == 'B' and e.get('cat') == 'operator')


def train(data, hooks, num_epochs=2):
    net = gm.simple_cnn()
    return net, gm.train(net, *data, gm.cpu_devices(2), num_epochs=num_epochs, hooks=hooks)


class StopAt(gm.Hook):
    """Stops the run after global step ``step`` (as Ctrl-C would), or raises ``error`` there."""

    def __init__(self, step, error=None):
        self.step, self.error = step, error

    def step_end(self, run, step, samples, timer):
        if (run.epoch - 1) * STEPS + step == self.step:
            if self.error is not None:
                raise self.error
            return True
        return None


# -- the steps: exactly those, each device its own track ----------------------------------------

@pytest.mark.parametrize('steps, firsts', [
    ('2:3', 0),  # inside epoch 1
    ('3:6', 1),  # across the evaluation of epoch 1: not in it; step 5 opens epoch 2
    ('1:1', 1),  # the run's first step
    ('5:5', 1),  # the first step of epoch 2
    ('8', 0),    # the run's last step, N alone
])
def test_the_trace_holds_exactly_the_steps_asked_for(data, tmp_path, steps, firsts):
    path, out = tmp_path / 'p.json', io.StringIO()
    net, _ = train(data, [Profile(steps, str(path), out)])
    start, stop = profiling.parse_steps(steps)
    calls = operators(path)
    convs, count = convolutions(net), stop - start + 1
    for device in DEVICES:
        assert calls[(device, '_backward_Convolution')] == count * convs, (device, calls)
    # An epoch's first step also runs one sample forward on the first device (its batch check);
    # an evaluation would add forward passes on every device.
    assert calls[('cpu(0)', 'Convolution')] == (count + firsts) * convs
    assert calls[('cpu(1)', 'Convolution')] == count * convs
    assert out.getvalue().startswith(f'profile of steps {start}-{stop} on cpu(0), cpu(1): '
                                     f'written to {path}')
    assert os.listdir(tmp_path) == ['p.json']  # MXNet's own file, beside it, is gone


def test_the_trace_is_chromes_with_a_process_per_device_and_small_ids(data, tmp_path):
    path = tmp_path / 'p.json'
    train(data, [Profile((2, 3), str(path), io.StringIO())], num_epochs=1)
    trace = json.loads(path.read_text())
    events = trace['traceEvents']
    processes = {e['args']['name']: e['pid'] for e in events if e.get('name') == 'process_name'}
    assert processes['cpu(0)'] == 0 and processes['cpu(1)'] == 1  # first, in the run's order
    threads = [e for e in events if e.get('name') == 'thread_name']
    assert {e['pid'] for e in threads} >= {0, 1}
    assert all(e['args']['name'].startswith(('cpu(0) thread', 'cpu(1) thread'))
               for e in threads if e['pid'] < 2)
    # every id small enough for a browser's JSON numbers; every begin has its end
    assert all(0 <= e.get(key, 0) < 2**31 for e in events for key in ('pid', 'tid', 'id'))
    ends = collections.Counter((e['pid'], e['tid'], e['ph']) for e in events if e['ph'] in 'BE')
    assert all(ends[(p, t, 'B')] == ends[(p, t, 'E')] for p, t, _ in ends)
    # MXNet's copy of the operators without their device is left out
    assert 'operator' not in processes
    assert trace['otherData']['profiled'] == '2:3'


def test_the_ten_costliest_operators_are_printed(data, tmp_path):
    out = io.StringIO()
    hook = Profile('2:3', str(tmp_path / 'p.json'), out)
    train(data, [hook], num_epochs=1)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith('its ten costliest operators:')
    assert lines[1].split() == ['operator', 'calls', 'total', 'ms', 'share']
    assert len(lines) == 12 and len(hook.rows) == 10
    totals = [ms for _, _, ms, _ in hook.rows]
    assert totals == sorted(totals, reverse=True)
    assert 0 < sum(share for *_, share in hook.rows) <= 1
    names = [row[0] for row in hook.rows]
    assert '_backward_Convolution' in names and 'Convolution' in names
    assert 'ImperativeBulk' not in names  # the operators one by one, not MXNet's bulks
    for line, (name, calls, ms, share) in zip(lines[2:], hook.rows):
        assert line.split() == [name, str(calls), f'{ms:.2f}', f'{share:.1%}']


def test_train_takes_a_profile(data, tmp_path, capsys):
    path = tmp_path / 'lib.json'
    gm.train(gm.simple_cnn(), *data, gm.cpu_devices(2), num_epochs=1, profile=(2, 3, str(path)))
    assert f'profile of steps 2-3 on cpu(0), cpu(1): written to {path}' in capsys.readouterr().out
    assert operators(path)[('cpu(1)', 'Convolution')] == 2 * 2


# -- stops, failures, and the profiler left as found ----------------------------------------------

def test_a_stop_inside_the_range_writes_what_was_profiled_and_says_so(data, tmp_path):
    path, out = tmp_path / 'p.json', io.StringIO()
    hook = Profile('2:6', str(path), out)
    with pytest.raises(Interrupted):
        train(data, [StopAt(3), hook])
    assert hook.written == (2, 3)
    assert os.listdir(tmp_path) == ['p.json']
    assert out.getvalue().startswith('profile of steps 2-3 (the run stopped after step 3, '
                                     'before step 6) on cpu(0), cpu(1): written to')
    assert operators(path)[('cpu(1)', '_backward_Convolution')] == 2 * 2
    # The profiler is off: what runs now is in no later profile.
    mx.np.arange(7, ctx=gm.cpu_devices(2)[1]).wait_to_read()
    later = tmp_path / 'later.json'
    train(data, [Profile('2:2', str(later), io.StringIO())], num_epochs=1)
    assert not any(name == '_npi_arange' for _, name in operators(later))


def test_a_failure_inside_the_range_writes_what_was_profiled(data, tmp_path):
    path, out = tmp_path / 'p.json', io.StringIO()
    with pytest.raises(RuntimeError, match='a fault'):
        train(data, [StopAt(2, RuntimeError('a fault')), Profile('1:3', str(path), out)])
    assert '(the run failed (RuntimeError) after step 2, before step 3)' in out.getvalue()
    assert json.loads(path.read_text())['otherData']['profiled'] == '1:2'


def test_a_stop_just_before_the_range_drops_the_begun_profile_and_goes_on(data, tmp_path,
                                                                         monkeypatch):
    # The profiler starts once step 2 is done (step 3 comes next); a stop there leaves before
    # any step is profiled: MXNet's dump is taken and dropped, without an error of its own
    # (the fit's leave would hide one behind the Interrupted), and the run goes on to profile.
    failed, leave = [], Profile.leave

    def watched(self, run):
        try:
            return leave(self, run)
        except BaseException as e:
            failed.append(e)
            raise
    monkeypatch.setattr(Profile, 'leave', watched)
    path, out = tmp_path / 'p.json', io.StringIO()
    hook = Profile('3:4', str(path), out)
    with pytest.raises(Interrupted) as stop:
        train(data, [StopAt(2), hook])
    assert failed == [] and hook.written is None and not path.exists()
    net = stop.value.training.net
    stop.value.training.fit()
    assert failed == [] and hook.written == (3, 4)
    assert operators(path)[('cpu(1)', '_backward_Convolution')] == 2 * convolutions(net)


def test_without_a_profile_the_profiler_is_never_touched(data, monkeypatch):
    calls = []
    for name in ('set_config', 'set_state', 'dump', 'dumps', 'pause', 'resume'):
        monkeypatch.setattr(mx.profiler, name, lambda *a, _name=name, **k: calls.append(_name))
    train(data, [], num_epochs=1)
    assert calls == []


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize('steps, message', [
    ('5:3', '`profile` 5:3: STOP is before START'),
    ('0:2', '`profile` 0:2: steps count from 1'),
    ('abc', "`profile` 'abc' is not a range of steps"),
    ('3:', "`profile` '3:' is not a range of steps"),
    ('1.5:2', "`profile` '1.5:2' is not a range of steps"),
    ((2, 'x'), "`profile` (2, 'x') is not a range of steps"),
    ((True, 2), '`profile` (True, 2) is not a range of steps'),
    ('\uff11:\uff13', "`profile` '\uff11:\uff13' is not a range of steps"),  # full-width digits
    ('\u0661:\u0663', "`profile` '\u0661:\u0663' is not a range of steps"),  # Arabic-Indic
    ('2:\U0001d7d1', "`profile` '2:\U0001d7d1' is not a range of steps"),  # mathematical bold 3
])
def test_bad_ranges_are_refused_in_one_line(steps, message):
    with pytest.raises(GluonMultiGPUError) as refused:
        Profile(steps)
    assert str(refused.value).startswith(message)
    assert 'give START:STOP' in str(refused.value) and '\n' not in str(refused.value)


def test_the_range_and_the_file_are_checked_before_any_step(data, tmp_path):
    with pytest.raises(GluonMultiGPUError, match=r"ends past the run's last step, 8 \(2 epoch"):
        train(data, [Profile('7:9', str(tmp_path / 'p.json'))])
    with pytest.raises(GluonMultiGPUError, match=r'^`profile_file` \S+/missing/p\.json: directory '
                       r'\S+/missing does not exist; create it first$'):
        Profile('1:2', str(tmp_path / 'missing' / 'p.json'))
    with pytest.raises(GluonMultiGPUError, match=r'^`profile_file` \S+ is a directory; give a file '
                       'name$'):
        Profile('1:2', str(tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('path, message', [
    ('', '`profile_file` is an empty path; give a file name'),
    (3, '`profile_file` is int: give a file name (a str or a path)'),
    ('/dev/null', '`profile_file` /dev/null is not a regular file; give the name of a file'),
])
def test_a_trace_file_that_cannot_be_one_is_refused_in_one_line(path, message):
    # the library's words for train's `profile_file` (and Profile's path), as for `metrics`
    with pytest.raises(GluonMultiGPUError) as refused:
        Profile('1:2', path)
    assert str(refused.value) == message


def test_cpu_contexts_the_profiler_cannot_tell_apart_are_refused(monkeypatch):
    monkeypatch.setattr(profiling.engine, 'cores', lambda: 1)
    with pytest.raises(GluonMultiGPUError, match=r'cores \(1\), and cpu\(1\) is past them'):
        profiling.check_devices(gm.cpu_devices(2))


# -- the script ---------------------------------------------------------------------------------

def test_the_script_profiles_and_prints_the_table(train_script, tmp_path, capsys):
    path = tmp_path / 'trace.json'
    assert train_script.main(QUICK + ['--num-epochs', '1', '--profile', '2:3',
                                      '--profile-file', str(path)]) == 0
    out = capsys.readouterr().out
    assert f'profile of steps 2-3 on cpu(0), cpu(1): written to {path}' in out
    assert 'its ten costliest operators:' in out
    calls = operators(path)
    for device in DEVICES:
        assert calls[(device, 'Convolution')] > 0 and calls[(device, '_backward_Convolution')] > 0


@pytest.mark.parametrize('argv, message', [
    (['--profile', '5:3'], '--profile 5:3: STOP is before START'),
    (['--profile', 'ten'], "--profile 'ten' is not a range of steps"),
    # a value beginning with '-': argparse took it for a flag ('expected one argument')
    (['--profile', '-1:3'], "--profile '-1:3' is not a range of steps"),
    (['--profile', '\uff11:\uff13'], "--profile '\uff11:\uff13' is not a range of steps"),
    (['--profile', '0:1'], '--profile 0:1: steps count from 1'),
    (['--profile', '4:5'], "--profile 4:5 ends past the run's last step, 4 (1 epoch(s) of 4 "),
    (['--profile-file', 'p.json'], '--profile-file needs --profile START:STOP'),
    (['--profile', '1:2', '--kvstore', 'local', 'device'], '--profile follows one run'),
    (['--profile', '1:2', '--profile-file', 'missing/p.json'],
     '--profile-file missing/p.json: directory'),
    (['--profile', '1:2', '--profile-file', '.'], '--profile-file . is a directory'),
])
def test_the_scripts_bad_input_is_one_line_and_status_2(train_script, tmp_path, monkeypatch,
                                                         capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert train_script.main(QUICK + ['--num-epochs', '1'] + argv) == 2
    captured = capsys.readouterr()
    assert captured.out == '' and len(captured.err.splitlines()) == 1
    assert captured.err.startswith(f'error: {message}') and 'Traceback' not in captured.err
    assert os.listdir(tmp_path) == []


def test_a_stop_of_the_script_inside_the_range_writes_the_steps_profiled(
        train_script, tmp_path, monkeypatch, capsys):
    step_end = Profile.step_end

    def ctrl_c_at_step_2(self, run, step, samples, timer):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # heard after the next step
        return step_end(self, run, step, samples, timer)
    monkeypatch.setattr(Profile, 'step_end', ctrl_c_at_step_2)
    path = tmp_path / 'p.json'
    status = train_script.main(QUICK + ['--num-epochs', '2', '--profile', '2:7',
                                        '--profile-file', str(path)])
    assert status == 130
    out = capsys.readouterr().out
    assert 'profile of steps 2-3 (the run stopped after step 3, before step 7)' in out
    assert json.loads(path.read_text())['otherData']['profiled'] == '2:3'


def test_a_resumed_run_is_profiled_from_where_it_can_be(train_script, tmp_path, capsys):
    first = str(tmp_path / 'first')
    assert train_script.main(QUICK + ['--num-epochs', '1', '--checkpoint-dir', first]) == 0
    path = tmp_path / 'p.json'
    for steps in ('6:7', '5:6'):
        ckpt = str(tmp_path / steps.replace(':', '-'))
        shutil.copytree(first, ckpt)
        assert train_script.main(QUICK + ['--num-epochs', '2', '--checkpoint-dir', ckpt,
                                          '--resume', '--profile', steps,
                                          '--profile-file', str(path)]) == 0
    out = capsys.readouterr().out
    assert 'profile of steps 6-7 on' in out
    # The resume's own step cannot be profiled: nothing tells a hook where a run resumes.
    assert 'profile of steps 6-6 (the run resumed at step 5) on' in out


# -- MXNet's dump: through a pipe, never from a disk ---------------------------------------------

@pytest.mark.parametrize('limit', [100 << 10, 8 << 10])
def test_a_trace_past_a_file_size_limit_is_one_line_and_status_1(tmp_path, limit):
    """``ulimit -f 100`` once cut MXNet's own dump short, and reading it was a traceback
    (JSONDecodeError); the dump no longer reaches a disk, and the trace, past the limit, is one
    line naming it, status 1, the file that was there as it was, nothing else left."""
    (tmp_path / 'mine.txt').write_text("the user's own file")
    path = tmp_path / 'p.json'
    path.write_text('{"an earlier trace": true}')
    proc = run_bounded(limited([sys.executable, str(REPO / 'scripts' / 'train.py'), *QUICK,
                                '--num-epochs', '1', '--profile', '2:3', '--profile-file',
                                str(path)], FSIZE=limit), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and 'Traceback' not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f'error: could not write {path}: File too large; '), \
        proc.stderr
    assert sorted(os.listdir(tmp_path)) == ['mine.txt', 'p.json']
    assert path.read_text() == '{"an earlier trace": true}'


def capture(write, output, what, parse=bytes, limit=foreign.LIMIT):
    """Call ``write(path)``, an outside writer that writes a whole file at the ``path`` it is
    given, and return what it wrote (``foreign.Capture.take``)."""
    pipe = foreign.Capture(output, what, limit)
    return pipe.take(lambda: write(pipe.path), parse)


def test_a_dump_that_cannot_be_read_whole_is_an_oserror_naming_the_trace(tmp_path):
    threads = threading.active_count()
    target = str(tmp_path / 'p.json')

    def cut_short(path):
        with open(path, 'w', encoding='utf-8') as f:
            f.write('{\n    "traceEvents": [\n        {"ph": "B", "na')
    with pytest.raises(OSError) as failed:
        capture(cut_short, target, "MXNet's profiler",
                        parse=lambda data: profiling.read_events(data.decode()))
    assert failed.value.errno == errno.EIO and failed.value.filename == target
    assert "MXNet's profiler delivered 46 bytes that cannot be read whole" in str(failed.value)

    def too_much(path):
        with open(path, 'wb') as f:
            for _ in range(40):
                f.write(b'x' * 4096)  # past the pipe's buffer: read on, not blocked
    with pytest.raises(OSError) as failed:
        capture(too_much, target, 'a writer', limit=1000)
    assert failed.value.errno == errno.EFBIG and failed.value.filename == target
    with pytest.raises(RuntimeError, match='its own error'):
        capture(lambda path: (_ for _ in ()).throw(RuntimeError('its own error')),
                        target, 'a writer')
    assert capture(lambda path: open(path, 'wb').close(), target, 'a writer') == b''
    assert os.listdir(tmp_path) == [] and threading.active_count() == threads


def test_mxnets_dump_never_reaches_a_disk(data, tmp_path, monkeypatch):
    """Every file MXNet's profiler is given is a pipe of this process or a path below
    /dev/null (which it can neither create nor remove), and the folder holds the trace only."""
    given = []
    set_config = mx.profiler.set_config

    def watched(**kwargs):
        if 'filename' in kwargs:
            given.append(kwargs['filename'])
        return set_config(**kwargs)
    monkeypatch.setattr(mx.profiler, 'set_config', watched)
    train(data, [Profile('2:3', str(tmp_path / 'p.json'), io.StringIO())], num_epochs=1)
    assert given and all(name.startswith(('/proc/self/fd/', os.devnull + os.sep))
                         for name in given), given
    assert os.listdir(tmp_path) == ['p.json']


# -- the default file: never one the package did not write ----------------------------------------

def test_the_default_file_replaces_only_a_trace_of_the_packages(data, tmp_path, monkeypatch,
                                                                 capsys):
    """Without a file named, the trace goes to ./profile.json: a file there that is not a trace
    the package wrote is refused in one line before any work and left as it was; one of its
    own traces is replaced. A file named is replaced (the user asked for it, as with --json)."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / 'profile.json'
    for held in ('my notes, not a trace', json.dumps({'traceEvents': []})):
        mine.write_text(held)
        with pytest.raises(GluonMultiGPUError) as refused:
            gm.train(gm.simple_cnn(), *data, gm.cpu_devices(2), num_epochs=1, profile='2:3')
        said = str(refused.value)
        assert said.startswith('the `profile` trace profile.json holds a file that '
                               'gluon-multigpu did not write; it is left as it is: ') and \
            '`profile_file`' in said and '\n' not in said, said
        assert mine.read_text() == held and os.listdir(tmp_path) == ['profile.json']
        assert 'epoch 1' not in capsys.readouterr().out  # refused before any work
        named = Profile('2:3', 'profile.json', io.StringIO())  # named: replaced when written
        assert named.path == 'profile.json'
    mine.unlink()
    gm.train(gm.simple_cnn(), *data, gm.cpu_devices(2), num_epochs=1, profile='2:3')
    first = json.loads(mine.read_text())
    assert mine.read_bytes().startswith(profiling.TRACE_MARKER)
    gm.train(gm.simple_cnn(), *data, gm.cpu_devices(2), num_epochs=1, profile='3:4')
    assert first['otherData']['steps'] == '2:3'
    assert json.loads(mine.read_text())['otherData']['steps'] == '3:4'  # its own: replaced
    # what the command line calls before any work when --profile-file is not given
    mine.write_text('my notes')
    with pytest.raises(GluonMultiGPUError, match='did not write'):
        profiling.check_default('profile.json')
    mine.unlink()
    profiling.check_default('profile.json')  # nothing there: nothing to refuse

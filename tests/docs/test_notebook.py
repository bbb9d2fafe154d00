"""The notebook as a client: ``live.Live``, and the shipped notebook run in a real kernel.

``Live`` is tested with a display of the test's own (the kernel's is IPython's);
the slow tests start a real ipykernel kernel of this very Python (a kernel spec
written for the test: nothing installed, nothing of the user's used), run
``notebooks/multiple_gpus_concise.ipynb`` end to end with nbclient, and
interrupt a training cell the way Jupyter's stop button does
(``KernelManager.interrupt_kernel``: SIGINT to the kernel's process group).
"""
import io
import json
import os
import queue
import re
import sys
import time
import types

import pytest

import gluon_multigpu as gm
from conftest import DATA, REPO

NOTEBOOK = REPO / 'notebooks' / 'multiple_gpus_concise.ipynb'
STEPS = 4  # steps an epoch of the data below


def data():
    return gm.data.synthetic_data('fashion-mnist', 32, num_train=32 * STEPS, num_test=64,
                                  num_devices=2)


class Screen:
    """A display of the test's own: what ``Live`` shows, every version of it."""

    def __init__(self):
        self.shown, self.displays = [], 0

    def __call__(self, bundle):
        self.displays += 1
        self.shown.append(bundle)
        return self

    def update(self, bundle, raw):
        assert raw
        self.shown.append(bundle)

    @property
    def text(self):
        return self.shown[-1]['text/plain']


class StopAt(gm.Hook):
    """Stops the run after step ``step`` of epoch ``epoch`` (as Ctrl-C would)."""
    handles_signals = True

    def __init__(self, epoch, step):
        self.at = (epoch, step)

    def step_end(self, run, step, samples, timer):
        return (run.epoch, step) == self.at


def live_run(live, *hooks):
    train_iter, test_iter = data()
    return gm.Training(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2),
                       hooks=[*hooks, live])


class Syncs:
    """Stands in for ``npx`` in ``live`` (observe/live.py): counts the waits for the devices."""

    def __init__(self):
        self.count = 0

    def waitall(self):
        self.count += 1


# Finding a kernel: never importing IPython.

def fake_ipython(monkeypatch, get_ipython):
    module = types.ModuleType('IPython')
    module.get_ipython = get_ipython
    monkeypatch.setitem(sys.modules, 'IPython', module)


def test_no_kernel_where_ipython_is_not_loaded(monkeypatch):
    monkeypatch.delitem(sys.modules, 'IPython', raising=False)
    assert gm.live.jupyter_shell() is None
    assert 'IPython' not in sys.modules  # looked for, never imported


def test_a_kernel_is_an_ipython_zmq_shell_or_started_by_ipkernelapp(monkeypatch):
    class ZMQInteractiveShell:
        config = {}

    class Shell(ZMQInteractiveShell):  # Colab's and others' subclasses
        pass

    class TerminalInteractiveShell:
        def __init__(self, config):
            self.config = config

    def broken():
        raise RuntimeError('no shell')

    for shell in [ZMQInteractiveShell(), Shell(), TerminalInteractiveShell({'IPKernelApp': {}})]:
        fake_ipython(monkeypatch, lambda shell=shell: shell)
        assert gm.live.jupyter_shell() is shell
    for shell in [TerminalInteractiveShell({}), None]:  # a terminal IPython; plain Python
        fake_ipython(monkeypatch, lambda shell=shell: shell)
        assert gm.live.jupyter_shell() is None
    fake_ipython(monkeypatch, broken)
    assert gm.live.jupyter_shell() is None


def test_outside_a_kernel_live_shows_nothing(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, 'IPython', raising=False)
    syncs = Syncs()
    monkeypatch.setattr(gm.live, 'npx', syncs)
    live = gm.live.Live(interval=0)
    live_run(live).fit(1)
    assert live.lines == [] and syncs.count == 0
    assert capsys.readouterr() == ('', '')


class Terminal(io.StringIO):
    """A stream that is a terminal, as stderr in a shell is."""

    def isatty(self):
        return True


def test_on_a_terminal_live_prints_lines_with_the_time_left(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, 'IPython', raising=False)
    terminal = Terminal()
    run = live_run(gm.live.Live(stream=terminal, line_interval=0))
    run.fit(2)
    lines = terminal.getvalue().splitlines()
    steps = [line for line in lines if ': step ' in line]
    assert len(steps) == 2 * STEPS  # line_interval 0: every step
    assert re.fullmatch(r'epoch 1/2: step 1/4, \d+ samples/s, epoch ends in \d+ s, fit in \d+ s',
                        steps[0])
    assert [line for line in lines if ': loss ' in line] == [
        gm.epoch_line(e, 2) for e in run.result.epochs]
    assert lines.index(gm.epoch_line(run.result.epochs[0], 2)) == STEPS  # said at the epoch's end
    assert re.fullmatch(r'done: 2 epoch\(s\) in \d+ s', lines[-1]) and len(lines) == 2 * STEPS + 3
    assert capsys.readouterr() == ('', '')  # on its stream only


def test_train_shows_progress_where_stderr_is_a_terminal_unless_told_not_to(monkeypatch):
    monkeypatch.delitem(sys.modules, 'IPython', raising=False)
    train_iter, test_iter = data()
    for stderr, settings, shown in ((io.StringIO(), {}, False),  # piped: silent
                                    (Terminal(), {'progress_interval': 0}, False),
                                    (Terminal(), {}, True)):
        monkeypatch.setattr(sys, 'stderr', stderr)
        result = gm.train(gm.simple_cnn(), train_iter, test_iter, gm.cpu_devices(2),
                          num_epochs=1, **settings)
        assert (stderr.getvalue().splitlines()[:1] == [gm.epoch_line(result.epochs[0], 1)]) \
            is shown, stderr.getvalue()
        assert bool(stderr.getvalue()) is shown
    lives = [h for h in gm.last_run().hooks if isinstance(h, gm.live.Live)]
    assert [live.line_interval for live in lives] == [10.0]  # the command line's default


# What Live shows.

def test_one_display_per_fit_changed_in_place(monkeypatch):
    syncs = Syncs()
    monkeypatch.setattr(gm.live, 'npx', syncs)
    screen = Screen()
    run = live_run(gm.live.Live(interval=0, display=screen))
    run.fit(2)
    assert screen.displays == 1
    assert screen.shown[0]['text/plain'] == 'epoch 1/2: starting'
    steps = [b['text/plain'] for b in screen.shown if 'step ' in b['text/plain']]
    assert len(steps) == 2 * STEPS  # interval 0: every step drawn
    assert re.fullmatch(r'epoch 1/2: step 1/4, \d+ samples/s, epoch ends in \d+ s, fit in \d+ s',
                        steps[0])
    assert syncs.count == 2 * STEPS  # the devices waited for only to draw
    lines = screen.text.splitlines()
    assert lines[:2] == [gm.epoch_line(e, 2) for e in run.result.epochs]
    assert re.fullmatch(r'done: 2 epoch\(s\) in \d+ s', lines[2]) and len(lines) == 3
    html = screen.shown[-1]['text/html']
    assert html.startswith('<pre') and 'epoch 2/2: loss' in html
    assert '<progress value="2" max="4">' in screen.shown[2]['text/html']
    run.fit(1)  # the next fit: a display of its own, in its own cell
    assert screen.displays == 2 and screen.text.splitlines()[0].startswith('epoch 3/3: loss')


def test_drawn_at_most_every_interval(monkeypatch):
    syncs = Syncs()
    monkeypatch.setattr(gm.live, 'npx', syncs)
    screen = Screen()
    live_run(gm.live.Live(interval=3600, display=screen)).fit(3)
    assert len(screen.shown) == 2 and syncs.count == 0  # shown at the start, drawn at the end
    assert len(screen.text.splitlines()) == 4


def test_interrupted_then_resumed(monkeypatch):
    monkeypatch.setattr(gm.live, 'npx', Syncs())
    screen = Screen()
    run = live_run(gm.live.Live(interval=0, display=screen), StopAt(2, 3))
    with pytest.raises(gm.Interrupted):
        run.fit(2)
    lines = screen.text.splitlines()
    assert lines[-1] == 'interrupted in epoch 2 after step 3/4: fit() goes on from there'
    assert lines[0].startswith('epoch 1/2: loss') and len(lines) == 2
    run.fit()
    assert screen.displays == 2
    resumed = [b['text/plain'] for b in screen.shown]
    assert 'epoch 2/2: going on from the step where it stopped' in resumed
    assert 'epoch 2/2: step 4/4' in [t.split(',')[0] for t in resumed]
    assert screen.text.splitlines()[0].startswith('epoch 2/2: loss')


def test_how_a_fit_ended_is_its_last_line(monkeypatch):
    monkeypatch.setattr(gm.live, 'npx', Syncs())
    screen = Screen()
    run = live_run(gm.live.Live(interval=0, display=screen), StopAt(1, STEPS))
    with pytest.raises(gm.Interrupted):  # in an epoch's last step: after that epoch
        run.fit(3)
    assert screen.text.splitlines()[-1] == 'interrupted after epoch 1 of 3: fit() goes on from there'

    class Fails(gm.Hook):
        def step_end(self, run, step, samples, timer):
            raise RuntimeError('a hook failed')
    run = live_run(gm.live.Live(interval=0, display=screen), Fails())
    with pytest.raises(RuntimeError):
        run.fit(1)
    assert re.fullmatch(r'stopped in epoch 1 by RuntimeError \(\d+ s\)', screen.text)


def test_only_the_last_epochs_are_kept(monkeypatch):
    monkeypatch.setattr(gm.live, 'npx', Syncs())
    screen = Screen()
    live_run(gm.live.Live(interval=0, keep=2, display=screen)).fit(4)
    lines = screen.text.splitlines()
    assert lines[0] == '(2 earlier epoch(s): result.epochs)'
    assert [l[:9] for l in lines[1:3]] == ['epoch 3/4', 'epoch 4/4'] and len(lines) == 4


def test_a_failing_display_never_stops_training(monkeypatch):
    class Broken(Screen):
        def update(self, bundle, raw):
            raise OSError('the front end went away')
    monkeypatch.setattr(gm.live, 'npx', Syncs())
    result = live_run(gm.live.Live(interval=0, display=Broken())).fit(2)
    assert len(result.epochs) == 2


# A real kernel.

def kernel_env(tmp_path):
    """The kernel's environment: the data, this checkout, and nothing written to the home."""
    env = dict(os.environ, GLUON_MULTIGPU_DATA=str(DATA), IPYTHONDIR=str(tmp_path / 'ipython'),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get('PYTHONPATH')])))
    for name in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY'):  # the notebook sets up its engine
        env.pop(name, None)
    return env


def kernel_manager(tmp_path, manager_class):
    """A manager of an ipykernel kernel of this Python (``sys.executable``), whatever is installed.

    The kernel spec is written for the test, so neither a ``python3`` spec of the
    user's nor one of another environment is used (a fresh CI machine has none).
    """
    from jupyter_client.kernelspec import KernelSpecManager  # pylint: disable=import-outside-toplevel
    spec = tmp_path / 'kernels' / 'gluon-multigpu-test'
    spec.mkdir(parents=True)
    (spec / 'kernel.json').write_text(json.dumps({
        'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}',
                 '--HistoryManager.hist_file=:memory:'],
        'display_name': 'gluon-multigpu tests', 'language': 'python'}))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / 'kernels')])
    return manager_class(kernel_name='gluon-multigpu-test', kernel_spec_manager=specs,
                         connection_file=str(tmp_path / 'kernel.json'))


def outputs_of(nb, cell_id):
    """The outputs of the cell with id ``cell_id``."""
    cell = next(c for c in nb.cells if c.get('id') == cell_id)
    return cell.outputs


def text_of(outputs, name='stdout'):
    return ''.join(o['text'] for o in outputs if o['output_type'] == 'stream'
                   and o['name'] == name)


def displays_of(outputs):
    return [o['data']['text/plain'] for o in outputs if o['output_type'] == 'display_data']


#: The notebook's subset of Fashion-MNIST as it is written, and as the test runs it: 4,096
#: training images (32 steps of 128, the interrupt in step 10 of them) and 512 test images. Its
#: cells train 11 epochs of the subset (two, one more, the interrupted two, and two for each of
#: three kvstores); at 6,144 and 2,048 they were five sixths of the test's time. What the
#: test reads does not depend on the size but for the accuracies above chance (0.3): 2 epochs
#: of 32 steps reach 0.56 (of 24 steps 0.36, too near; of 12 steps 0.27, and the loss of a
#: third epoch no longer falls).
WRITTEN, BOUNDED = 'num_train=6144, num_test=2048', 'num_train=4096, num_test=512'
NB_STEPS = 4096 // 128  # steps an epoch of the bounded subset


@pytest.mark.slow
def test_the_notebook_runs_end_to_end_in_a_real_kernel(tmp_path):
    import nbformat  # pylint: disable=import-outside-toplevel  (the test extra's)
    from nbclient import NotebookClient  # pylint: disable=import-outside-toplevel
    from jupyter_client.manager import AsyncKernelManager  # pylint: disable=import-outside-toplevel
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    split = next(c for c in nb.cells if c.get('id') == 'split')
    assert split.source.count(WRITTEN) == 1, 'the notebook no longer loads its subset as this ' \
        'test expects'
    split.source = split.source.replace(WRITTEN, BOUNDED)  # every cell's data comes from it
    client = NotebookClient(nb, km=kernel_manager(tmp_path, AsyncKernelManager), timeout=300,
                            startup_timeout=120,
                            resources={'metadata': {'path': str(NOTEBOOK.parent)}})
    # A cell that raises fails here (CellExecutionError). cleanup_kc: the kernel is shut down
    # at the end, which nbclient does not do for a kernel manager it was given (it held 1 GB
    # for the rest of the session).
    client.execute(env=kernel_env(tmp_path), cleanup_kc=True)

    assert outputs_of(nb, 'devices')[0]['data']['text/plain'] == '[cpu(0), cpu(1)]'
    assert outputs_of(nb, 'forward')[0]['data']['text/plain'] == \
        '[((2, 10), cpu(0)), ((2, 10), cpu(1))]'
    weights = text_of(outputs_of(nb, 'weights'))
    assert weights.startswith('not initialized on cpu(2)\n')
    assert weights.endswith('the copies are equal: True\n')
    counts = re.fullmatch(r"([\d,]+) parameter values in the text's network, ([\d,]+) in "
                          r'gm.resnet18\n', text_of(outputs_of(nb, 'compiled'))).groups()
    assert counts[0] == counts[1]
    assert text_of(outputs_of(nb, 'split')) == (
        '(64, 1, 28, 28) images and (64,) labels on cpu(0)\n'
        '(64, 1, 28, 28) images and (64,) labels on cpu(1)\n')
    untrained = float(re.search(r'test acc ([\d.]+)', text_of(outputs_of(nb, 'evaluate')))[1])
    assert untrained < 0.3

    # Training: one display, changed in place, its epoch lines and how it ended; no flood.
    train = outputs_of(nb, 'train')
    assert len(train) == 2 and len(displays_of(train)) == 1
    shown = displays_of(train)[0].splitlines()
    assert [l[:12] for l in shown[:2]] == ['epoch 1/2: l', 'epoch 2/2: l']
    assert shown[2].startswith('done: 2 epoch(s)')
    accuracy = float(re.fullmatch(r'test acc: ([\d.]+), [\d.]+ sec/epoch on \[cpu\(0\), cpu\(1\)\]\n',
                                  text_of(train))[1])
    assert accuracy > 0.3  # chance: 0.1

    # Training on: one more epoch, the Trainer's updates going on, the loss still falling.
    went_on = text_of(outputs_of(nb, 'continue'))
    assert 'epochs: [1, 2, 3]\n' in went_on
    before, after = map(int, re.search(r'updates: (\d+) -> (\d+)', went_on).groups())
    assert before == 2 * NB_STEPS and after == 3 * NB_STEPS  # 4096 images in batches of 128
    losses = json.loads(re.search(r'training loss: (\[.*\])', went_on)[1])
    assert losses[2] < losses[1] < losses[0]  # re-initialised, epoch 3 would start over

    # Interrupting: said once, once more for the second; Interrupted caught; the run goes on.
    interrupted = outputs_of(nb, 'interrupt')
    said = text_of(interrupted)
    assert said.count('interrupted: stopping after the current step') == 1
    assert said.count('interrupted again: still stopping') == 1
    assert 'caught Interrupted: interrupted in epoch 1 after 10 batch(es)' in said
    assert displays_of(interrupted) == [
        f'interrupted in epoch 1 after step 10/{NB_STEPS}: fit() goes on from there']
    assert text_of(outputs_of(nb, 'interrupt'), 'stderr') == ''
    resumed = text_of(outputs_of(nb, 'resume'))
    assert 'the run is kept: True - epochs done: 0' in resumed  # the kernel lived on
    assert 'epochs and their samples: [(1, 4096), (2, 4096)]' in resumed

    # Kvstores: the same parameters, the copies equal, accuracies above chance.
    compared = text_of(outputs_of(nb, 'kvstores-compare'))
    rows = re.findall(r'kvstore (\w+) *: test acc ([\d.]+), [\d.]+ sec/epoch, copies on the '
                      r'devices differ by (\S+)', compared)
    assert [r[0] for r in rows] == ['local', 'device', 'none']
    assert all(float(acc) > 0.3 and float(spread) == 0 for _, acc, spread in rows)
    assert len({acc for _, acc, _ in rows}) == 1
    differences = re.findall(r'largest parameter difference, local vs (\w+): (\S+)', compared)
    assert [k for k, _ in differences] == ['device', 'none']
    assert all(float(d) < 1e-4 for _, d in differences)
    assert len(displays_of(outputs_of(nb, 'kvstores'))) == 3

    for cell in nb.cells:  # a small notebook: no cell floods its output
        if cell.cell_type == 'code':
            # (a stream's text may come in several messages, as the kernel flushes it: a loaded
            # machine split one print in two; consecutive parts of one stream count once)
            parts = [o.get('name', o['output_type']) for o in cell.outputs]
            kept = [p for i, p in enumerate(parts) if i == 0 or p != parts[i - 1]]
            assert len(kept) <= 3, (cell.id, cell.outputs)
            assert not [o for o in cell.outputs if o['output_type'] == 'error']


class Kernel:
    """A started kernel and a client that reads what each execution sends."""

    def __init__(self, tmp_path):
        from jupyter_client.manager import KernelManager  # pylint: disable=import-outside-toplevel
        self.km = kernel_manager(tmp_path, KernelManager)
        self.km.start_kernel(cwd=str(REPO), env=kernel_env(tmp_path))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def start(self, code):
        """Begin executing ``code``; return its message id."""
        return self.kc.execute(code)

    def messages(self, msg_id, until=None, timeout=120):
        """Yield the IOPub messages of ``msg_id`` until it is idle (or ``until(msg)``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f'no end of execution within {timeout} s'
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 5))
            except queue.Empty:
                assert self.km.is_alive(), 'the kernel died'
                continue
            if msg['parent_header'].get('msg_id') != msg_id:
                continue
            yield msg
            if until is not None and until(msg):
                return
            if msg['msg_type'] == 'status' and msg['content']['execution_state'] == 'idle':
                return

    def run(self, code, timeout=120):
        """Execute ``code``; return (its stdout, its error name or None)."""
        return summary(list(self.messages(self.start(code), timeout=timeout)))

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def summary(messages):
    out = ''.join(m['content']['text'] for m in messages
                  if m['msg_type'] == 'stream' and m['content']['name'] == 'stdout')
    errors = [m['content']['ename'] for m in messages if m['msg_type'] == 'error']
    return out, (errors[0] if errors else None)


def stream_has(text):
    return lambda m: m['msg_type'] == 'stream' and text in m['content']['text']


SETUP = '''
import os
import time
import gluon_multigpu as gm
devices = gm.cpu_devices(2)
train_iter, test_iter = gm.load_data_fashion_mnist(
    128, root=os.path.join(os.environ['GLUON_MULTIGPU_DATA'], 'fashion-mnist'), num_train=2048,
    num_test=512, num_devices=2)


class Holds(gm.Hook):
    """Holds step 2 until interrupted, then the stop until interrupted again."""

    def interrupts(self, run):
        return next(h for h in run.hooks if isinstance(h, gm.interrupt.Interruptible)).requests

    def wait(self, run, n):
        deadline = time.monotonic() + 120
        while self.interrupts(run) < n and time.monotonic() < deadline:
            time.sleep(0.02)

    def step_end(self, run, step, samples, timer):
        if (run.epoch, step) == (1, 2):
            print('holding step 2', flush=True)
            self.wait(run, 1)

    def stopped(self, run, totals):
        self.wait(run, 2)
'''


@pytest.mark.slow
def test_interrupting_the_kernel_stops_after_a_step_and_keeps_kernel_and_run(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        out, error = kernel.run(SETUP)
        assert error is None, out
        # The stop button, twice: the first while step 2 runs, the second while it stops.
        msg_id = kernel.start('run = gm.Training(gm.simple_cnn(), train_iter, test_iter, '
                              'devices, hooks=[Holds()])\nrun.fit(2)')
        seen = list(kernel.messages(msg_id, until=stream_has('holding step 2')))
        kernel.km.interrupt_kernel()
        seen += kernel.messages(msg_id, until=stream_has('interrupted: stopping'))
        kernel.km.interrupt_kernel()
        seen += kernel.messages(msg_id)
        out, error = summary(seen)
        assert error == 'Interrupted'  # not KeyboardInterrupt: nothing raised mid-step
        assert 'interrupted again: still stopping after the current step' in out
        tb = next(m for m in seen if m['msg_type'] == 'error')['content']['evalue']
        assert tb.startswith('interrupted in epoch 1 after 2 batch(es)')
        assert kernel.km.is_alive()
        kernel.km.interrupt_kernel()  # between cells the kernel ignores it
        out, error = kernel.run('import signal\nprint(signal.getsignal(signal.SIGINT))')
        assert error is None and out == '<built-in function default_int_handler>\n'  # the
        # kernel's own handler is back, in the cell
        out, error = kernel.run('r = gm.last_run().fit()\n'
                                'print(gm.last_run() is run, [(e.epoch, e.samples) for e in '
                                'r.epochs], run.trainer.optimizer.num_update)')
        assert error is None
        assert out == 'True [(1, 2048), (2, 2048)] 32\n'  # the rest of epoch 1, then epoch 2

        # A run the stop button finds inside MXNet (no hook holding it): once the display
        # shows the run going, one interrupt stops it after a step, and it goes on after.
        msg_id = kernel.start('run = gm.Training(gm.simple_cnn(), train_iter, test_iter, '
                              'devices)\nrun.fit(100)')
        seen = list(kernel.messages(msg_id, until=lambda m: m['msg_type'] == 'update_display_data'
                                    and 'step' in m['content']['data']['text/plain']))
        kernel.km.interrupt_kernel()
        seen += kernel.messages(msg_id)
        out, error = summary(seen)
        assert error == 'Interrupted' and out.count('interrupted: stopping') == 1
        displays = [m for m in seen if m['msg_type'] == 'display_data']
        updates = [m for m in seen if m['msg_type'] == 'update_display_data']
        assert len(displays) == 1  # one display, changed in place
        ids = {m['content']['transient']['display_id'] for m in displays + updates}
        assert len(ids) == 1
        # In a step, or in an epoch's last step or evaluation (the epoch then ends first).
        assert re.fullmatch(r'interrupted (in epoch \d+ after step \d+/16|after epoch \d+ of '
                            r'100): fit\(\) goes on from there',
                            updates[-1]['content']['data']['text/plain'].splitlines()[-1])
        out, error = kernel.run('done = run.epoch\nprint(done < 100, gm.last_run() is run)')
        assert (out, error) == ('True True\n', None)
        # fit(1): the rest of the interrupted epoch is that one epoch.
        out, error = kernel.run('r = run.fit(1)\nprint(r.epochs[-1].epoch == done + 1, '
                                'r.epochs[-1].samples)')
        assert (out, error) == ('True 2048\n', None)
    finally:
        kernel.close()

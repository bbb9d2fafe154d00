"""The record of the messages' wording: one golden test per message family.

Each test here pins a family's exact text once, computed from the function
that makes it (``cli/messages.py`` for the programs' stops, ``observe/interrupt.py``
for the library's Interruptible, ``error_line`` and ``flag`` for bad input).
The behavioural tests elsewhere assert what a message must say in their
situation (the flag, the path, the signal, the status); a deliberate rewording
changes the test of its family here, and no other. The book's epoch and final
lines (``section/results.py``) are the product's contract with the text: they are
pinned where they are tested (tests/outputs/test_reporting.py).
"""
import signal
import types

import mxnet as mx
import pytest

import gluon_multigpu as gm
from gluon_multigpu.cli import arguments
from gluon_multigpu.cli import messages
from lab.commands import failover as failover_cli
from lab.commands import network as network_cli
from gluon_multigpu.cli.arguments import error_line
from gluon_multigpu.errors import flag
from gluon_multigpu.machinery.training import _diverged_in  # pylint: disable=protected-access
from gluon_multigpu.multihost.supervise import Job
from lab.studies.sweep import Sweep
from lab.commands import sweeps

INT, HUP, TERM = signal.SIGINT, signal.SIGHUP, signal.SIGTERM


def sweep(done, of, path='out/results.json', complete=False):
    """A stand-in for a ``Sweep``: ``done`` of ``of`` measurements in ``path``."""
    made = types.SimpleNamespace(done=list(range(done)), units=list(range(of)), path=path,
                                 complete=complete)
    made.describe = lambda: Sweep.describe(made)
    return made


def test_train_acknowledges_a_first_signal_at_once():
    """The record of train's first-signal lines, one per kind of signal and of run."""
    assert messages.train_heard(INT) == (
        'Ctrl-C: stopping after the current step; Ctrl-C again to stop now')
    assert messages.train_heard(HUP) == (
        'SIGHUP (the terminal closed): stopping after the current step; Ctrl-C again to stop now')
    assert messages.train_heard(TERM) == (
        'SIGTERM: stopping after the current step; Ctrl-C again to stop now')
    assert messages.train_heard(TERM, launched=True) == (
        'SIGTERM from the launcher: stopping after the current step')
    assert messages.train_heard(INT, book=True) == (
        "Ctrl-C: stopping once the steps already queued have run (the text's loop queues them "
        "ahead of the devices, up to the epoch's end); Ctrl-C again to stop now")
    assert messages.train_heard(INT, joining=True) == (
        'Ctrl-C: stopping while joining the parameter server')
    assert messages.launcher_stops(12) == (
        'the launcher stops the job: stopping after step 12, as every worker does')


def test_a_later_worker_of_a_launched_job_points_at_rank_0s_checkpoint(tmp_path):
    """Rank 1 of an ordered stop, with --checkpoint-dir given and nothing of its own there."""
    from gluon_multigpu.cli import train
    line = train.interrupted_message(TERM, gm.Interrupted(1, 3), str(tmp_path),
                                     ['--checkpoint-dir', str(tmp_path)], rank=1)
    assert f'; rank 0 keeps the checkpoint in {tmp_path}; resume with: ' in line, line
    assert 'no checkpoint written' not in line
    alone = train.interrupted_message(TERM, gm.Interrupted(1, 3), str(tmp_path),
                                      ['--checkpoint-dir', str(tmp_path)])
    assert alone.endswith(f'; nothing was saved in {tmp_path} yet: the same command starts the '
                          'run again from the beginning'), alone


def test_train_says_where_it_stopped_and_how_to_go_on():
    """The record of train's last line after a stop, a second signal, or a late signal."""
    stop = gm.Interrupted(2, 5)
    assert messages.train_stopped(HUP, stop, 'gluon-multigpu-train --resume', 'ckpt') == (
        'interrupted by SIGHUP in epoch 2 after 5 batch(es); checkpoint in ckpt; resume with: '
        'gluon-multigpu-train --resume')
    assert messages.train_stopped(INT, gm.Interrupted(1, None, epoch_done=True)) == (
        'interrupted by SIGINT after epoch 1 had finished its steps, before epoch 2 began; no '
        'checkpoint written (add --checkpoint-dir DIR to be able to resume)')
    between = gm.Interrupted.between_runs(1, 'epoch 2 of kvstore device',
                                    ['epoch 2 of kvstore local', 'epoch 3 of every kvstore'], TERM)
    measured = 'epochs 1-2 of kvstore none, device; epoch 1 of kvstore local'
    assert messages.train_stopped(TERM, between, kept=(measured, None, ['a.json'])) == (
        'interrupted by SIGTERM at the end of epoch 2 of kvstore device: epoch 2 of kvstore '
        'local and epoch 3 of every kvstore not begun; the results of epochs 1-2 of kvstore '
        'none, device; epoch 1 of kvstore local are kept, marked partial, in a.json')
    assert messages.train_stopped(INT, stop, kept=(None, 'epoch 2 of kvstore device', [])) == (
        'interrupted by SIGINT during epoch 2 of kvstore device (in epoch 2 after 5 '
        'batch(es)); no epoch had finished: no output was written')
    assert messages.comparison_why(INT, 'epoch 2 of kvstore device') == (
        'interrupted by SIGINT during epoch 2 of kvstore device')
    assert messages.comparison_why(INT, None) == 'interrupted by SIGINT between two epochs'
    # A launched job's worker after the first: rank 0 writes the checkpoint, not this one.
    assert messages.train_stopped(TERM, stop, 'cmd --resume', 'ckpt', by_rank_0=True) == (
        'interrupted by SIGTERM in epoch 2 after 5 batch(es); rank 0 keeps the checkpoint in '
        'ckpt; resume with: cmd --resume')
    assert messages.train_stopped_now() == 'stopped at once (a second signal)'
    assert messages.train_stopped_now('no checkpoint was saved in ckpt') == (
        'stopped at once (a second signal): no checkpoint was saved in ckpt')
    assert messages.train_finished_anyway(TERM, outputs=True, checkpoint=True) == (
        'SIGTERM came after the last step: the run is complete, its outputs are written and its '
        'checkpoint holds it; exit status 143, as for any stop by a signal')


def test_any_program_stopped_while_starting_or_where_its_code_was():
    """The record of the lines of a signal before the handlers, or raised in the code."""
    assert messages.while_starting(HUP, began=False) == (
        'interrupted while starting: nothing was written')
    assert messages.while_starting(TERM, began=True) == (
        'SIGTERM came as the run was ending: its results are as printed')
    assert messages.nothing_written(gm.Interrupted.by_signal(TERM)) == (
        'interrupted by SIGTERM: nothing was written')
    assert str(gm.Interrupted(2, 5)) == 'interrupted in epoch 2 after 5 batch(es)'


def test_the_sweeps_stop_lines():
    """The record of the measuring programs' stop lines: first, second, last, late, failed write."""
    assert sweeps.sweep_heard(INT) == (
        'Ctrl-C: stopping after the current step; every measurement finished is kept (Ctrl-C '
        'again to stop now)')
    assert sweeps.sweep_stopped(TERM, sweep(0, 4), 'x') == (
        'interrupted by SIGTERM: nothing had been measured yet, nothing was written')
    assert sweeps.sweep_stopped(INT, sweep(2, 4), 'python scripts/scaling.py --resume') == (
        'interrupted by SIGINT: 2 of 4 measurements in out/results.json (marked partial); '
        'continue with: python scripts/scaling.py --resume')
    assert sweeps.sweep_stopped_now(sweep(1, 4)) == (
        'stopped at once (a second signal): 1 of 4 measurements in out/results.json (marked '
        'partial)')
    assert sweeps.sweep_stopped_now(sweep(4, 4, complete=True), whole=False) == (
        'stopped at once (a second signal): 4 of 4 measurements in out/results.json (complete); '
        'a write of it was still in progress: it holds the measurements before the last')
    assert sweeps.sweep_stopped_now(sweep(0, 4)) == (
        'stopped at once (a second signal): nothing had been measured yet, nothing was written')
    assert sweeps.sweep_stopped_now() == (
        'stopped at once (a second signal): the measurements finished before are kept in the '
        'results file')
    assert sweeps.sweep_finished_anyway(HUP) == (
        'SIGHUP came after the last measurement: the run is complete and written; exit status '
        '129')
    assert sweeps.partial_heading(sweep(1, 4)) == (
        'partial results (interrupted): 1 of 4 measurements')
    full = OSError(28, 'No space left on device', 'out/sweep/results.json')
    assert messages.could_not_write(full, 'the results file keeps what was measured before') == (
        'error: could not write out/sweep/results.json: No space left on device; free space or '
        'choose another place (the results file keeps what was measured before)')


def test_the_librarys_interrupt_lines():
    """The record of the lines an ``Interruptible`` says in a notebook or a Python session."""
    said = []
    hook = gm.interrupt.Interruptible(say=said.append)
    hook._acknowledge(1)  # pylint: disable=protected-access
    hook._acknowledge(2)  # pylint: disable=protected-access
    run = types.SimpleNamespace(num_epochs=2, result=types.SimpleNamespace(
        epochs=[types.SimpleNamespace(epoch=2)]))
    hook.signum = INT
    hook.leave(run)
    assert said == [
        'interrupted: stopping after the current step (the run is kept: fit() goes on from '
        'there)',
        'interrupted again: still stopping after the current step (the run and the process are '
        'kept)',
        'the interrupt came after the last step: the fit is complete']


def test_the_launchers_stop_lines():
    """The record of the launcher's lines when a signal stops its job."""
    job = Job(types.SimpleNamespace(grace=30.0), [], [], messages)
    said = []
    job.say, job.stop = said.append, lambda coordinated: True
    assert job.stop_on_signal(INT) == 130
    assert said == [
        'SIGINT: stopping the job: the workers finish a step (the same for all) and write their '
        'checkpoint (up to 30 s); Ctrl-C again to stop every process at once',
        'stopped by SIGINT: every process has ended']


def test_bad_input_error_lines(monkeypatch, capsys):
    """The record of a representative few bad-input lines, as the programs print them."""
    cpus = [mx.cpu(i) for i in range(3)]
    with pytest.raises(gm.DeviceError) as split:
        gm.model.fit_batch('simple-cnn', cpus, 60000, 2)
    assert error_line(split.value) == (
        'error: a batch of 2 cannot be split across 3 devices; use --batch-size 3 or more')
    with pytest.raises(gm.GluonMultiGPUError) as unknown:
        gm.kvstores.check_kvstore('fast', cpus)
    assert error_line(unknown.value) == (
        "error: unknown kvstore 'fast'; choose one of "
        f'{", ".join(gm.kvstores.KVSTORES + gm.kvstores.DIST_KVSTORES)}')
    monkeypatch.setattr(gm.devices, 'num_gpus', lambda: 0)
    with pytest.raises(gm.DeviceError) as missing:
        gm.devices.gpu_devices(2)
    assert error_line(missing.value) == (
        'error: 2 GPU(s) requested but none is available (no GPU, or a CPU build of MXNet), or '
        'use --cpu-devices 2 to run the same code on CPU contexts')
    with pytest.raises(gm.GluonMultiGPUError) as alone:
        gm.distributed.join(['dist_sync', 'device'])
    assert error_line(alone.value) == (
        'error: --kvstore dist_sync trains across machines; give it alone, not with other '
        'kvstores')
    with pytest.raises(gm.engine.EngineError) as engine:
        gm.engine.check_environment({'OMP_NUM_THREADS': 'abc'})
    assert str(engine.value) == ("environment variable OMP_NUM_THREADS='abc' is not a whole "
                                 'number from 1 to 1024; set it so or unset it')
    _, note = gm.model.fit_batch('simple-cnn', cpus[:2], 101, 1000)
    assert gm.GluonMultiGPUError(note).describe(flag) == (
        '--batch-size 1000 is more than the 101 training images: using a batch of 101')
    parser = arguments.OneLineParser(prog='gluon-multigpu-train')
    parser.add_argument('--num-epochs', type=arguments.int_in(1, 100000))
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(['--num-epochs', '0'])
    assert stop.value.code == 2 and capsys.readouterr().err == (
        'gluon-multigpu-train: error: argument --num-epochs: 0 is not positive; give a whole '
        'number from 1 to 100000 (see --help)\n')


def test_a_diverged_run_says_where_and_what_to_do():
    """The record of the lines of a run whose parameters or loss became non-finite."""
    def diverges():
        raise gm.TrainingDiverged('parameter dense0_weight became non-finite by step 4')
    checkpoint = types.SimpleNamespace(exists=lambda: True, describe=lambda: 'epoch 1, in ckpt')
    run = types.SimpleNamespace(epoch=2, result=types.SimpleNamespace(lr=0.1),
                                call=lambda name, e: gm.Checkpointer.diverged(checkpoint, run, e))
    with pytest.raises(gm.TrainingDiverged) as stop:
        _diverged_in(run, diverges)
    assert str(stop.value) == (
        'parameter dense0_weight became non-finite by step 4 in epoch 2; lower the learning rate '
        '(it is 0.1); the last good checkpoint (epoch 1, in ckpt) is kept')


def test_the_labs_refusals_and_stop_lines(monkeypatch, capsys):
    """The record of the lab's lines (failover and network studies): no cluster here, a stop."""
    monkeypatch.setattr(failover_cli.cluster, 'available', lambda: (False, 'no sshd'))
    with pytest.raises(arguments.UsageError) as refused:
        failover_cli.check(types.SimpleNamespace(data_dir=None))
    assert str(refused.value) == 'no cluster can be made here: no sshd'
    monkeypatch.setattr(network_cli.cluster, 'available', lambda: (False, 'no sshd'))
    assert network_cli.main(['--quick']) == 2
    assert capsys.readouterr().err == (
        'error: the network study runs on a cluster of network namespaces, and none can be made '
        'here: no sshd\n')

    def stopped(args, argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(network_cli, 'run', stopped)
    assert network_cli.main(['--quick', '--out', 'study']) == 130
    assert capsys.readouterr().err == (
        'interrupted by SIGINT: stopped the run in progress and removed its cluster; the rows '
        'measured are in study\n')

"""The main path: from ``python scripts/train.py`` to ``trainer.step``, short and one way.

A reader follows one kvstore's run from the script to the Trainer's step in at
most 8 calls through at most 5 files, and never comes back to a file already
left (no round trip); several kvstores go through the comparison, which wraps
the same runs, still without a round trip. The stack is the one Python has at
the first ``trainer.step`` of a real run.
"""
import json
import sys
import textwrap

import pytest

from conftest import REPO, run_bounded

#: Runs scripts/train.py with its arguments, and prints the stack at the first trainer.step.
PROBE = textwrap.dedent('''
    import json, os, runpy, sys, traceback
    import gluon_multigpu as gm
    gm.engine.configure(2)
    from mxnet import gluon
    seen, step = [], gluon.Trainer.step
    def recorded(self, *args, **kwargs):
        if not seen:
            seen.append([(os.path.relpath(f.filename, REPO), f.name)
                         for f in traceback.extract_stack()[:-1]])
        return step(self, *args, **kwargs)
    gluon.Trainer.step = recorded
    sys.argv = [os.path.join(REPO, 'scripts', 'train.py'), *json.loads(ARGV)]
    try:
        runpy.run_path(sys.argv[0], run_name='__main__')
    except SystemExit as e:
        print('STACK', json.dumps(seen[0] if seen else None), 'STATUS', e.code, flush=True)
''')


def stack_at_step(tmp_path, data_dir, *kvstores):
    argv = ['--cpu-devices', '2', '--model', 'simple-cnn', '--num-epochs', '1', '--num-train',
            '256', '--num-test', '64', '--progress-interval', '0', '--data-dir', str(data_dir),
            '--kvstore', *kvstores]
    script = tmp_path / 'probe.py'
    script.write_text(f'REPO = {str(REPO)!r}\nARGV = {json.dumps(json.dumps(argv))}\n' + PROBE)
    proc = run_bounded([sys.executable, str(script)], timeout=300, cwd=tmp_path)
    line = next(l for l in proc.stdout.splitlines() if l.startswith('STACK'))
    stack, status = line[len('STACK '):].rsplit(' STATUS ', 1)
    assert status == '0', proc.stderr[-2000:]
    frames = json.loads(stack)
    start = next(i for i, (path, _) in enumerate(frames) if path == 'scripts/train.py')
    return frames[start:]


def files_in_order(frames):
    """The files of ``frames`` as the path visits them, a file once per visit."""
    visits = []
    for path, _ in frames:
        if not visits or visits[-1] != path:
            visits.append(path)
    return visits


@pytest.mark.slow
def test_one_kvstore_reaches_the_step_in_8_calls_through_5_files_one_way(tmp_path, fashion_dir):
    frames = stack_at_step(tmp_path, fashion_dir, 'device')
    calls = len(frames) - 1  # the script's own frame makes the first call
    visits = files_in_order(frames)
    assert frames[-1] == ['gluon_multigpu/section/steps.py', 'train_batch'], frames
    assert calls <= 8, frames
    assert len(set(visits)) <= 5, visits
    assert len(visits) == len(set(visits)), f'a round trip: {visits}'
    assert 'gluon_multigpu/runs/comparison.py' not in visits  # one kvstore: training directly


@pytest.mark.slow
def test_several_kvstores_go_through_the_comparison_one_way(tmp_path, fashion_dir):
    frames = stack_at_step(tmp_path, fashion_dir, 'device', 'local')
    visits = files_in_order(frames)
    assert 'gluon_multigpu/runs/comparison.py' in visits and frames[-1][1] == 'train_batch'
    assert len(visits) == len(set(visits)), f'a round trip: {visits}'

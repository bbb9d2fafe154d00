"""tools/book_run.py, the book's 10-epoch run from one commit: the clone, the segments, the record.

The run itself takes hours (its figures are in docs/results/book-run.json);
here a repository of its own stands for the checkout, with a ``scripts/train.py``
that writes a ``--json`` as the real one does, so what the tool does around
the run is checked: that every segment runs from the one clone of the first
call's commit, whatever the checkout does meanwhile.
"""
import json
import subprocess
import sys
import textwrap

import pytest

from conftest import load_tool

book_run = load_tool('book_run')

#: Stands for scripts/train.py: a checkpoint after epoch 1, its --json when COMPLETE=1.
TRAIN = textwrap.dedent('''\
    import json, os, sys
    out = sys.argv[sys.argv.index('--json') + 1]
    epochs = [{'epoch': 1, 'train_loss': 1.0, 'where': os.path.abspath(__file__)}]
    ckpt = sys.argv[sys.argv.index('--checkpoint-dir') + 1]
    os.makedirs(ckpt, exist_ok=True)
    with open(os.path.join(ckpt, 'manifest.json'), 'w') as f:  # as a checkpoint after epoch 1
        json.dump({'history': epochs}, f)
    if os.environ.get('COMPLETE') == '1':  # as train.py: the --json only when a run ends
        with open(out, 'w') as f:
            json.dump({'complete': True, 'argv': sys.argv[1:], 'runs': [{'epochs': epochs}]}, f)
    sys.exit(int(os.environ.get('STATUS', '0')))
    ''')


def git(repo, *args):
    return subprocess.run(['git', '-C', str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    repo = tmp_path / 'checkout'
    (repo / 'scripts').mkdir(parents=True)
    (repo / 'scripts' / 'train.py').write_text(TRAIN)
    git(repo, 'init', '-q')
    git(repo, 'add', '.')
    git(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'one')
    monkeypatch.setattr(book_run, 'ROOT', str(repo))
    return repo


def test_each_segment_runs_from_the_first_calls_commit_and_the_record_names_it(
        checkout, tmp_path, monkeypatch):
    work, out = tmp_path / 'work', tmp_path / 'out.json'
    first = git(checkout, 'rev-parse', 'HEAD')
    monkeypatch.setenv('STATUS', '137')  # a segment killed
    assert book_run.main(['--work', str(work), '--out', str(out)]) == 137
    assert not out.exists()  # not finished: nothing recorded
    (checkout / 'scripts' / 'train.py').write_text(TRAIN + '# changed\n')
    git(checkout, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qam', 'two')
    monkeypatch.setenv('STATUS', '0')
    monkeypatch.setenv('COMPLETE', '1')
    assert book_run.main(['--work', str(work), '--out', str(out)]) == 0
    record = json.loads(out.read_text())
    assert record['commit'] == first != git(checkout, 'rev-parse', 'HEAD')
    assert [s['status'] for s in record['segments']] == ['exit 137', 'exit 0']
    assert [(s['epochs_before'], s['epochs_after']) for s in record['segments']] == \
        [(0, 1), (1, 1)]  # from the checkpoint: the killed segment had ended epoch 1
    assert {s['commit'] for s in record['segments']} == {first}
    assert record['runs'][0]['epochs'][0]['where'] == str(work / 'src' / 'scripts' / 'train.py')
    argv = record['argv']
    assert argv[:len(book_run.BOOK)] == book_run.BOOK and '--resume' in argv
    assert argv[argv.index('--checkpoint-dir') + 1] == str(work / 'ckpt')


def test_a_segment_whose_tool_was_killed_is_marked_so_by_the_next(checkout, tmp_path):
    work = tmp_path / 'work'
    assert book_run.main(['--work', str(work)]) == 0
    segments = json.loads((work / 'segments.json').read_text())
    segments[-1]['status'] = 'running'  # what a killed tool leaves
    (work / 'segments.json').write_text(json.dumps(segments))
    assert book_run.main(['--work', str(work)]) == 0
    assert [s['status'] for s in json.loads((work / 'segments.json').read_text())] == \
        ['killed', 'exit 0']


def test_uncommitted_changes_or_a_changed_clone_are_refused_in_one_line(checkout, tmp_path,
                                                                        capsys):
    (checkout / 'scripts' / 'train.py').write_text(TRAIN + '# not committed\n')
    with pytest.raises(SystemExit) as stop:
        book_run.main(['--work', str(tmp_path / 'work')])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'uncommitted changes' in err
    assert not (tmp_path / 'work').exists()
    git(checkout, 'checkout', '--', '.')
    assert book_run.main(['--work', str(tmp_path / 'work')]) == 0
    (tmp_path / 'work' / 'src' / 'scripts' / 'train.py').write_text('changed')
    with pytest.raises(SystemExit) as stop:
        book_run.main(['--work', str(tmp_path / 'work')])
    assert stop.value.code == 2 and 'must come from its commit' in capsys.readouterr().err

"""The measured figures of README.md and docs/*.md agree with the results files they come from.

``tools/figures.py`` (the maintainer's tool: ``--check``, ``--write``) ties each
figure to a file under docs/results/ by a marker; these tests run its check on
the real docs, and show on small made-up docs that a figure differing from
its file, a measured figure without a marker and a results file that says
not where or when it was measured each fail, naming the file and line.
No training: they read text files only.
"""
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from gluon_multigpu.base.machine import stamp
from lab.studies.csvfiles import STAMP_COLUMNS, stamped
from conftest import load_tool

REPO = Path(__file__).resolve().parents[2]
figures = load_tool('figures')

STAMP = {'machine': 'AMD EPYC, 2 cores', 'date': '2026-11-27'}


def test_the_docs_figures_agree_with_their_results_files():
    assert figures.check(str(REPO)) == []


def test_each_allowed_pending_or_unchecked_entry_is_still_in_its_file():
    for doc, figure, why in figures.ALLOWED + figures.PENDING:
        assert figure in ' '.join((REPO / doc).read_text().split()), (doc, figure, why)
    for doc, heading, why in figures.UNCHECKED:
        assert heading in (REPO / doc).read_text().split('\n'), (doc, heading, why)


def test_the_tool_checks_from_the_command_line():
    proc = subprocess.run([sys.executable, str(REPO / 'tools' / 'figures.py'), '--check'],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert (proc.returncode, proc.stderr) == (0, '')


def make_docs(root, readme, results):
    """A checkout in ``root``: README.md with ``readme`` and docs/results/ with ``results``."""
    (root / 'docs' / 'results').mkdir(parents=True)
    (root / 'README.md').write_text(readme)
    for name, content in results.items():
        path = root / 'docs' / 'results' / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(root)


RUN = dict(STAMP, runs=[{'seconds': 26.51}, {'seconds': 745}])
MARKED = ('# Title\n\nOne epoch took <!-- figure run.json runs/0/seconds .1f -->{}<!-- /figure -->'
          ' seconds.\n')


def test_a_marked_figure_that_differs_from_its_file_fails_with_file_and_line(tmp_path):
    root = make_docs(tmp_path, MARKED.format('13.4'), {'run.json': RUN})
    assert figures.check(root) == [
        "README.md:3: the text says '13.4', run.json gives '26.5'"]


def test_write_fills_the_marked_figures_then_the_check_passes(tmp_path):
    root = make_docs(tmp_path, MARKED.format('13.4'), {'run.json': RUN})
    assert figures.write(root) == ['README.md']
    assert (tmp_path / 'README.md').read_text() == MARKED.format('26.5')
    assert figures.check(root) == []


def test_a_results_file_that_says_not_where_or_when_fails(tmp_path):
    root = make_docs(tmp_path, MARKED.format('26.5'), {'run.json': {'runs': RUN['runs']}})
    [problem] = figures.check(root)
    assert problem.startswith('README.md:3: run.json') and '"machine" and "date"' in problem


@pytest.mark.parametrize('key', ['runs/7/seconds', 'runs/0/minutes', 'none.json'])
def test_a_marker_whose_key_or_file_gives_nothing_fails(tmp_path, key):
    name, key = ('none.json', 'x') if key == 'none.json' else ('run.json', key)
    text = f'<!-- figure {name} {key} .1f -->1<!-- /figure -->\n'
    root = make_docs(tmp_path, text, {'run.json': RUN})
    [problem] = figures.check(root)
    assert problem.startswith(f'README.md:1: {name} {key}:')


def test_csv_rows_are_picked_by_their_columns_and_figures_scaled(tmp_path):
    csv = ('scenario,split,images_per_sec,vs_even,machine,date\n'
           'busy,even,2844.7,1.0,m,d\nbusy,auto,4100.2,1.441,m,d\n')
    text = ('<!-- figure b.csv scenario=busy,split=auto/vs_even .2f -->1.44<!-- /figure -->x, '
            '<!-- figure b.csv scenario=busy,split=auto/images_per_sec ,.0f -->4,100'
            '<!-- /figure --> images/s, '
            '<!-- figure run.json runs/1/seconds min-s -->12 min 25 s<!-- /figure -->,'
            ' <!-- figure run.json runs/1/seconds /60:.1f -->12.4<!-- /figure --> min\n')
    assert figures.check(make_docs(tmp_path, text, {'b.csv': csv, 'run.json': RUN})) == []


def test_an_unmarked_measured_figure_fails_naming_file_and_line(tmp_path):
    text = ('# Speed\n\nThe main job takes about 40 seconds (3393 samples/s, 2.2 GiB).\n\n'
            '```\nepoch 1/2: loss 0.8373, 17.7 s\n```\n\n'
            'Set `--progress-interval 10 s`; 60,000 images in 2 epochs.\n')
    root = make_docs(tmp_path, text, {})
    assert figures.check(root) == [
        f"README.md:3: {figure!r} is a measured figure without a marker "
        f"(tie it to a results file, or remove it)"
        for figure in ('40 seconds', '3393 samples/s', '2.2 GiB')]


def test_the_suite_time_is_recorded_with_the_machine_and_the_date(tmp_path):
    """What pytest printed, recorded as it said: no figure typed by hand."""
    text = 'The suite: <!-- figure suite-time.json full/seconds min-s -->1 min 0 s<!-- /figure -->.\n'
    root = make_docs(tmp_path, text, {})
    said = {'full': '....\n1 failed, 903 passed, 10 skipped in 745.31s (0:12:25)\n',
            'fast': '....\n719 passed, 4 skipped in 120.40s (0:02:00)\n'}
    ran = []

    def run(command, **kwargs):
        ran.append(command)
        name = 'fast' if 'not slow and not soak' in command else 'full'
        return types.SimpleNamespace(stdout=said[name], returncode=int(name == 'full'))
    figures_ = figures.measure_suites(root, run=run)
    assert [c[1:] for c in ran] == [['-m', 'pytest', '-q'],
                                    ['-m', 'pytest', '-q', '-m', 'not slow and not soak']]
    assert figures_['full'] == {'tests': 914, 'seconds': 745, 'passed': False,
                                'command': 'python -m pytest -q'}
    assert (figures_['fast']['tests'], figures_['fast']['seconds']) == (723, 120)
    assert figures_['fast']['command'] == "python -m pytest -q -m 'not slow and not soak'"
    path = figures.record_suite_time(figures_, root)
    recorded = json.loads(Path(path).read_text())
    assert recorded['full'] == figures_['full'] and recorded['fast'] == figures_['fast']
    assert {k: recorded[k] for k in stamp()} == stamp()
    assert figures.check(root) == [
        "README.md:1: the text says '1 min 0 s', suite-time.json gives '12 min 25 s'"]
    with pytest.raises(ValueError, match='not a pytest summary'):
        figures.pytest_summary('Interrupted: 1 error during collection\nno tests ran\n')


def test_results_rows_are_stamped_with_the_machine_and_the_date():
    mark = stamp()
    assert sorted(mark) == sorted(STAMP_COLUMNS)
    assert mark['machine'].endswith(f'{os.cpu_count()} cores')
    flags = next((l.split(':')[1].split() for l in open('/proc/cpuinfo') if l.startswith('flags')),
                 [])  # the widest vector instructions the CPU lists, named after its model
    widest = ('AMX' if 'amx_bf16' in flags else 'AVX512-BF16' if 'avx512_bf16' in flags else
              'AVX-512' if 'avx512f' in flags else 'AVX2' if 'avx2' in flags else None)
    assert (f' ({widest}), ' in mark['machine']) if widest else ' (' not in mark['machine']
    assert len(mark['date']) == 10 and mark['date'][4] == '-'
    assert stamped([{'a': 1}]) == [dict(a=1, **mark)]


def test_an_unchecked_section_is_skipped_to_the_next_heading_of_its_level(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, 'UNCHECKED', (('README.md', '## Later', 'to come'),))
    text = ('# T\n\n## Later\n\n17 s\n\n### Inside\n\n18 s\n\n'
            '```\n## not a heading\n```\n\n19 s\n\n## Next\n\n20 s\n')
    assert figures.unmarked('README.md', text) == [(19, '20 s')]


def test_the_parameter_server_model_table_is_what_tools_projection_computes():
    """docs/distributed.md's model table is computed, not timed: its results file must hold what
    tools/projection.py computes from the package's constants now (rerun the tool if not)."""
    projection = load_tool('projection')
    written = json.loads(Path(projection.PATH).read_text())
    table = projection.table()
    assert {k: written[k] for k in table} == table
    assert written['links']['10gbit']['rows'][0]['workers'] == 1


def test_the_readmes_main_job_output_is_the_recorded_run():
    """The epoch lines and the closing line in the README's output block are those of
    docs/results/main-job.json, the main job's own --json (the README's first command with
    ``--json docs/results/main-job.json``), stamped with its machine and date."""
    from gluon_multigpu.section.results import EpochRecord, TrainResult, epoch_line
    data = json.loads((REPO / 'docs' / 'results' / 'main-job.json').read_text())
    assert data['machine'] and data['date']
    [run] = data['runs']
    fields = set(TrainResult.__dataclass_fields__)
    result = TrainResult(**{k: v for k, v in run.items() if k in fields and k != 'epochs'},
                         epochs=[EpochRecord(**e) for e in run['epochs']])
    expected = [epoch_line(r, len(result.epochs)) for r in result.epochs]
    expected.append(result.final_line())
    text = (REPO / 'README.md').read_text()
    block = _output_block(text)
    shown = [line for line in block.splitlines()
             if line.startswith('epoch ') or line.startswith('test acc:')]
    assert shown == expected


def test_the_readmes_python_output_computes_what_the_recorded_run_did():
    """The epoch lines under the README's Python block are the main job's but for their times
    (the same computation: tests/docs/test_readme.py), and it shows the progress lines."""
    run = json.loads((REPO / 'docs' / 'results' / 'main-job.json').read_text())['runs'][0]
    text = (REPO / 'README.md').read_text()
    block = text.split('```python')[1].split('```')[2]  # the block after the Python one
    shown = [line.split(', ')[:3] for line in block.splitlines() if ': loss ' in line]
    assert shown == [[f'epoch {e["epoch"]}/2: loss {e["train_loss"]:.4f}',
                      f'train acc {e["train_acc"]:.3f}', f'test acc {e["test_acc"]:.3f}']
                     for e in run['epochs']]
    assert re.search(r'^epoch 1/2: step \d+/469, .* epoch ends in \d+ s, fit in \d+ s$', block,
                     re.M)


def _output_block(text):
    """The README's first code block that is not a shell block: the main job's output."""
    parts = text.split('```')
    for i in range(1, len(parts), 2):
        if not parts[i].startswith(('sh', 'python', 'bash')):
            return parts[i]
    raise AssertionError('no output block in README.md')

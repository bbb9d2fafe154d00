"""tools/runtimes.py, the runtime matrix CI runs: its install lines are the README's, each
runtime runs what differs between runtimes, and its comparison of the main job's figures catches
a difference."""
import json
import pathlib
import sys

import pytest

from conftest import REPO, load_tool, run_bounded


runtimes = load_tool('runtimes')


def epochs(*rows):
    return [dict(zip(('epoch',) + runtimes.FIGURES, (i + 1,) + row)) for i, row in enumerate(rows)]


def test_the_install_lines_are_the_readmes():
    text = (REPO / 'README.md').read_text()
    assert runtimes.README_INSTALL.format(extras='').replace("'.'", '.') in text
    assert runtimes.NUMPY2_INSTALL.format(extras='') in text


def test_ci_runs_the_matrix_after_the_readme_suite():
    lines = [l for l in (REPO / '.ci' / 'run').read_text().splitlines()
             if l.strip() and not l.startswith('#')]
    # in the suite's venv (the README's line activated it), which it takes as the runtime it is
    assert lines[-1].startswith('python tools/runtimes.py --work ') and \
        '--suite-venv' in lines[-1].split()
    assert [i for i, l in enumerate(lines) if l.endswith('python -m pytest -q')] == \
        [len(lines) - 4]  # the README's line, then the folder for the venvs and its removal


def test_the_reference_is_the_numpy_the_package_required_before():
    name, python, install, extra = runtimes.RUNTIMES[0]
    assert name == 'numpy-1.23' and extra == ['numpy==1.23.5']
    assert {r[0] for r in runtimes.RUNTIMES} >= {'numpy-1.26', 'numpy-2', 'python-3.12',
                                                 'python-3.13'}


def test_the_checks_are_tests_that_exist_and_none_is_of_what_reads_the_tools_results():
    for check in runtimes.CHECKS:
        path, _, name = check.partition('::')
        assert (REPO / path).is_file(), check
        if name:
            assert f'def {name.split("[")[0]}(' in (REPO / path).read_text(), check
        # the tool's own results are read by the README's suite, after the tool has written them
        assert path not in ('tests/docs/test_runtimes.py', 'tests/docs/test_doc_figures.py')
    named = ' '.join(runtimes.CHECKS)
    for what in ('test_compat.py', 'test_checkpoint.py', 'test_notebook.py', 'test_opcache.py',
                 'test_distributed.py', 'test_importing_the_package'):
        assert what in named, what


def test_a_runtime_on_the_suites_python_passes_over_only_the_checks_of_the_python_alone(
        tmp_path, monkeypatch):
    assert set(runtimes.PYTHON_ONLY) < set(runtimes.CHECKS)
    ran = []
    monkeypatch.setattr(runtimes, 'shell', lambda command, *args: ran.append(command) or 0)
    monkeypatch.setattr(runtimes, 'tail', lambda log, lines=15: '3 passed in 1.0s')
    record = runtimes.run_checks('VENV', str(tmp_path / 'log'), runtimes.PYTHON_ONLY)
    named = [c for c in runtimes.CHECKS if f"'{c}'" in ran[0]]
    assert named == [c for c in runtimes.CHECKS if c not in runtimes.PYTHON_ONLY]
    assert record['passed_over'] == list(runtimes.PYTHON_ONLY) and record['passed'] == 3
    assert '(2 of the suite\'s Python passed over)' in runtimes.summary(
        {'name': 'numpy-2', 'checks': dict(record, failed=0), 'ok': True})
    every = runtimes.run_checks('VENV', str(tmp_path / 'log'))
    assert all(f"'{c}'" in ran[1] for c in runtimes.CHECKS) and 'passed_over' not in every


def test_the_suites_venv_is_the_runtime_of_its_python_and_numpy():
    here = runtimes.versions(sys.prefix)
    row = runtimes.suite_runtime(sys.prefix)
    if here['numpy'].startswith('1.') and here['python'].rsplit('.', 1)[0] in \
            [r[1] for r in runtimes.RUNTIMES if r[2] is runtimes.README_INSTALL and not r[3]]:
        name, python, install, extra = row
        assert python == here['python'].rsplit('.', 1)[0]
        assert install is runtimes.README_INSTALL and extra == [] and name != 'numpy-1.23'
    else:  # a NumPy 2 venv, or a Python no runtime installs with the README's line
        assert row is None


def test_in_the_suites_venv_only_the_main_job_runs(tmp_path, monkeypatch):
    # The main job played by a script that writes what train.py's --json holds, and says where
    # it ran: the venv's own Python, in the checkout
    stub = tmp_path / 'main_job.py'
    stub.write_text(
        'import json, os, sys\n'
        'out = sys.argv[sys.argv.index("--json") + 1]\n'
        'epochs = [{"epoch": 1, "train_loss": 0.85, "train_acc": 0.68, "test_acc": 0.82}]\n'
        'json.dump({"runs": [{"epochs": epochs}]}, open(out, "w"))\n'
        'print(sys.prefix, os.getcwd())\n')
    monkeypatch.setattr(runtimes, 'MAIN_JOB', [str(stub), '--data-dir'])
    record = runtimes.run_in_suite_venv('numpy-1.26', sys.prefix, str(tmp_path), 'DATA')
    assert record['ok'] and record['suite_venv'] and 'checks' not in record
    assert record['epochs'] == [{'epoch': 1, 'train_loss': 0.85, 'train_acc': 0.68,
                                 'test_acc': 0.82}]
    assert record['versions'] == runtimes.versions(sys.prefix)
    assert record['seconds'] >= record['main_job_seconds'] >= 0
    ran = pathlib.Path(record['log']).read_text().splitlines()
    assert ran[0].startswith('$ python ') and ran[0].endswith('--data-dir DATA --json '
                                                             f'{tmp_path}/numpy-1.26-main-job.json')
    assert ran[1] == f'{sys.prefix} {REPO}'
    assert runtimes.summary(record).endswith("this venv, where the README's suite passed: its "
                                             'main job only; ' f"{record['seconds']:.0f} s in all")


def test_a_reference_that_did_not_learn_fails():
    reference = {'name': 'ref', 'ok': True, 'epochs': epochs((2.30, 0.10, 0.10),
                                                             (2.30, 0.10, 0.11))}
    same = {'name': 'same', 'ok': True, 'epochs': epochs((2.30, 0.10, 0.10), (2.30, 0.10, 0.11))}
    runtimes.compare([reference, same])
    assert not reference['ok'] and not reference['learned']
    assert "the reference's main job did not learn (test accuracy 0.110 < 0.75)" in \
        reference['failure']
    assert same['equal_to_reference']  # equal, and failing with it through the reference


def test_equal_figures_pass_and_a_difference_beyond_1e_5_fails():
    reference = {'name': 'ref', 'ok': True, 'epochs': epochs((0.8493, 0.68, 0.8173),
                                                             (0.4320, 0.8363, 0.8486))}
    same = {'name': 'same', 'ok': True, 'epochs': epochs((0.8493, 0.68, 0.8173),
                                                         (0.4320 * (1 + 4e-6), 0.8363, 0.8486))}
    off = {'name': 'off', 'ok': True, 'epochs': epochs((0.8493, 0.68, 0.8173),
                                                       (0.4320, 0.8363, 0.8487))}
    short = {'name': 'short', 'ok': True, 'epochs': epochs((0.8493, 0.68, 0.8173))}
    records = [reference, same, off, short]
    runtimes.compare(records)
    assert reference['learned'] and reference['ok']
    assert reference['equal_to_reference'] and same['equal_to_reference'] and same['ok']
    assert not off['equal_to_reference'] and not off['ok']
    assert off['largest_relative_difference'] == pytest.approx(1 / 8486, rel=1e-3)
    assert not short['ok'] and short['largest_relative_difference'] == float('inf')
    assert 'NOT equal' in runtimes.summary(dict(off, versions={}))


def test_pytests_closing_line_is_counted():
    assert runtimes.pytest_counts('x\n== 3 failed, 770 passed, 2 skipped in 95.1s ==\n') == \
        {'failed': 3, 'passed': 770, 'skipped': 2}
    assert runtimes.pytest_counts('no tests ran') == {}


def test_a_python_that_is_absent_is_passed_over_in_one_line(tmp_path):
    assert runtimes.find_python('2.9') is None
    line = runtimes.summary({'name': 'python-2.9', 'absent': True, 'python_wanted': '2.9'})
    assert line == 'python-2.9: no Python 2.9 on this machine: passed over'


def test_the_committed_results_say_what_ran_and_that_it_held():
    results = json.loads((REPO / 'docs' / 'results' / 'runtimes.json').read_text())
    assert results['machine'] and results['date'] and results['reference'] == 'numpy-1.23'
    assert results['checks'] == list(runtimes.CHECKS)  # made by this version of the tool
    ran = [r for r in results['runtimes'] if not r.get('absent')]
    assert ran[0]['name'] == 'numpy-1.23' and all(r['ok'] for r in results['runtimes'])
    assert ran[0]['learned'] and ran[0]['epochs'][-1]['test_acc'] >= results['learned']
    names = [r['name'] for r in results['runtimes']]
    assert names == [r[0] for r in runtimes.RUNTIMES
                     if r[0] in (results['only'] or names) or r[0] == 'numpy-1.23']
    numpys = {r['versions']['numpy'].split('.')[0] for r in ran}
    assert numpys == {'1', '2'}
    for record in ran:
        assert record['equal_to_reference'], record['name']
        if record.get('suite_venv'):
            assert 'checks' not in record and record['tested_by'], record['name']
        else:
            assert record['checks'].get('failed', 0) == 0 and record['checks']['status'] == 0
            # some checks are files, some parametrized: at least one test each
            assert record['checks']['passed'] >= len(runtimes.CHECKS)
        assert record['seconds'] >= record['main_job_seconds'] + record.get('install_seconds', 0)
    # the run's wall time: each install overlapped the runtime before it
    assert max(r['seconds'] for r in ran) < results['seconds'] <= sum(r['seconds'] for r in ran)


def test_bad_flags_are_refused(tmp_path):
    proc = run_bounded([sys.executable, str(REPO / 'tools' / 'runtimes.py'), '--work',
                        str(tmp_path), '--data-dir', str(tmp_path / 'none')], timeout=60)
    assert proc.returncode == 2 and 'no data folder' in proc.stderr

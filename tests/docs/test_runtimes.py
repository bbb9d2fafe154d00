"""tools/runtimes.py, the runtime matrix CI runs: its install lines are the README's, and its
comparison of the main job's figures catches a difference."""
import importlib.util
import json
import sys

import pytest

from conftest import REPO, run_bounded


def load_tool():
    spec = importlib.util.spec_from_file_location('runtimes', REPO / 'tools' / 'runtimes.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runtimes = load_tool()


def epochs(*rows):
    return [dict(zip(('epoch',) + runtimes.FIGURES, (i + 1,) + row)) for i, row in enumerate(rows)]


def test_the_install_lines_are_the_readmes():
    text = (REPO / 'README.md').read_text()
    assert runtimes.README_INSTALL.format(extras='').replace("'.'", '.') in text
    assert runtimes.NUMPY2_INSTALL.format(extras='') in text


def test_ci_runs_the_matrix_after_the_readme_suite():
    lines = [l for l in (REPO / '.ci' / 'run').read_text().splitlines()
             if l.strip() and not l.startswith('#')]
    assert lines[-1].startswith('python tools/runtimes.py --work ')
    assert [i for i, l in enumerate(lines) if l.endswith('python -m pytest -q')] == \
        [len(lines) - 4]  # the README's line, then the folder for the venvs and its removal


def test_the_reference_is_the_numpy_the_package_required_before():
    name, python, install, extra = runtimes.RUNTIMES[0]
    assert name == 'numpy-1.23' and extra == ['numpy==1.23.5']
    assert {r[0] for r in runtimes.RUNTIMES} >= {'numpy-1.26', 'numpy-2', 'python-3.12',
                                                 'python-3.13'}


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
    ran = [r for r in results['runtimes'] if not r.get('absent')]
    assert ran[0]['name'] == 'numpy-1.23' and all(r['ok'] for r in results['runtimes'])
    numpys = {r['versions']['numpy'].split('.')[0] for r in ran}
    assert numpys == {'1', '2'}
    for record in ran:
        assert record['equal_to_reference'], record['name']
        assert record['fast_loop'].get('failed', 0) == 0 and record['fast_loop']['passed'] > 500
        assert record['slow_subset'].get('failed', 0) == 0
        assert record['slow_subset']['passed'] >= len(runtimes.SLOW)  # some are parametrized


def test_bad_flags_are_refused(tmp_path):
    proc = run_bounded([sys.executable, str(REPO / 'tools' / 'runtimes.py'), '--work',
                        str(tmp_path), '--data-dir', str(tmp_path / 'none')], timeout=60)
    assert proc.returncode == 2 and 'no data folder' in proc.stderr

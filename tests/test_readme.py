"""The README's two fresh-machine commands, and CI running the very same test command."""
import re

from conftest import REPO


def readme_commands():
    text = (REPO / 'README.md').read_text()
    first_block = re.search(r'```(?:sh|bash)?\n(.*?)```', text, re.S).group(1)
    return [l for l in first_block.splitlines() if l.strip() and not l.startswith('#')]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert 'scripts/train.py' in main_job and 'pip install -e .' in main_job
    assert tests.endswith('python -m pytest -q')


def test_ci_runs_the_readme_test_command():
    ci = (REPO / '.ci' / 'run').read_text().splitlines()
    assert readme_commands()[1] in ci

"""The structure of the package: floors that only go down, and sizes that fit a head.

The import rules are import-linter contracts in setup.cfg (docs/design.md says
why each floor is where it is); these tests run the tool on the package, show
that it catches an import running back up, and hold the size limits.
"""
import ast
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, 'gluon_multigpu')
LAB = os.path.join(ROOT, 'lab')
LINT = os.path.join(os.path.dirname(sys.executable), 'lint-imports')

#: The longest module and the longest function the project keeps (issue 27).
MODULE_LINES, FUNCTION_LINES = 450, 60
#: The longest docstring of a module (or class) and of a function: the reasoning behind them is
#: in docs/design.md, "Notes on the code" (issue 40).
MODULE_DOC_LINES, FUNCTION_DOC_LINES = 15, 12


def lint(cwd, env=None):
    return subprocess.run([LINT, '--no-cache'], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_contracts_hold():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'broken' in done.stdout and '0 broken' in done.stdout
    for contract in ('Floors only go down', 'loads no MXNet', 'plug-in of train of its own',
                     'never imports the lab', "The lab's floors"):
        assert contract in done.stdout


@pytest.mark.parametrize('module, line, broken', [
    # The section reaching up to what a long run needs: the circle this layout removed.
    ('core/training.py', 'from ..run import progress  # noqa', 'Floors only go down'),
    # The ground floor loading MXNet before the engine is set up.
    ('base/units.py', 'import mxnet  # noqa', 'loads no MXNet'),
    # One exercise using another.
    ('features/balance.py', 'from . import precision  # noqa', 'plug-in of train of its own'),
    # The installed package reaching into the lab, which is not installed.
    ('core/data.py', 'import lab.studies.sweep  # noqa', 'never imports the lab'),
])
def test_an_import_that_breaks_a_contract_fails_the_build(tmp_path, module, line, broken):
    for tree in (PACKAGE, LAB):
        shutil.copytree(tree, tmp_path / os.path.basename(tree),
                        ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(os.path.join(ROOT, 'setup.cfg'), tmp_path / 'setup.cfg')
    with open(tmp_path / 'gluon_multigpu' / module, 'a', encoding='utf-8') as f:
        f.write('\n' + line + '\n')
    env = {**os.environ, 'PYTHONPATH': str(tmp_path)}
    done = lint(tmp_path, env)
    assert done.returncode != 0
    assert f'{broken}' in done.stdout and 'BROKEN' in done.stdout, done.stdout


def test_the_import_drawing_finds_every_arrow_going_down_and_catches_one_going_up(tmp_path):
    # tools/imports.py: the same floors read with ast, imports inside functions too
    drawing = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'imports.py')],
                             capture_output=True, text=True, timeout=120, check=False)
    assert drawing.returncode == 0 and '0 arrow(s) against the floors' in drawing.stdout, \
        drawing.stdout
    assert 'gluon_multigpu.core ' in drawing.stdout and 'lab.hosts ' in drawing.stdout
    for tree in (PACKAGE, LAB, os.path.join(ROOT, 'tools')):
        shutil.copytree(tree, tmp_path / os.path.basename(tree),
                        ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(os.path.join(ROOT, 'setup.cfg'), tmp_path / 'setup.cfg')
    with open(tmp_path / 'gluon_multigpu' / 'core' / 'steps.py', 'a', encoding='utf-8') as f:
        f.write('\n\ndef _late():\n    from ..checkpoints import checkpoint  # noqa\n')
    drawing = subprocess.run([sys.executable, str(tmp_path / 'tools' / 'imports.py')],
                             capture_output=True, text=True, timeout=120, check=False)
    assert drawing.returncode == 1, drawing.stdout
    assert 'UP: gluon_multigpu.core imports gluon_multigpu.checkpoints' in drawing.stdout


def test_the_scripts_reach_the_package_only_through_its_command_line():
    for name in sorted(os.listdir(os.path.join(ROOT, 'scripts'))):
        if not name.endswith('.py'):
            continue
        with open(os.path.join(ROOT, 'scripts', name), encoding='utf-8') as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or '').startswith(
                    ('gluon_multigpu', 'lab')):
                assert node.module in ('gluon_multigpu.cli', 'lab.commands') or (
                    node.module, [a.name for a in node.names]) == ('gluon_multigpu', ['doctor']), \
                    (name, node.module)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith('gluon_multigpu') for a in node.names), name


def _sources():
    for tree in (PACKAGE, LAB):
        for folder, _, files in os.walk(tree):
            for name in sorted(files):
                if name.endswith('.py'):
                    yield os.path.join(folder, name)


def test_no_module_is_longer_than_the_limit():
    long = {}
    for path in _sources():
        with open(path, encoding='utf-8') as f:
            lines = sum(1 for _ in f)
        if lines > MODULE_LINES:
            long[os.path.relpath(path, ROOT)] = lines
    assert not long, f'modules over {MODULE_LINES} lines: {long}'


def test_no_function_is_longer_than_the_limit():
    long = {}
    for path in _sources():
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long[f'{os.path.relpath(path, ROOT)}:{node.name}'] = lines
    assert not long, f'functions over {FUNCTION_LINES} lines: {long}'


def test_no_two_modules_share_a_name():
    # a name says what a room holds: balance, scaling, launch, ... once each (packages count too)
    names = {}
    for path in _sources():
        name = os.path.basename(path)[:-3]
        if name == '__init__':
            name = os.path.basename(os.path.dirname(path))
        names.setdefault(name, []).append(os.path.relpath(path, ROOT))
    twice = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not twice, twice


def test_no_docstring_is_longer_than_the_limit():
    long = {}
    for path in _sources():
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                continue
            first = node.body[0] if node.body else None
            if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                continue
            lines = first.end_lineno - first.lineno + 1
            limit = FUNCTION_DOC_LINES if isinstance(node, (ast.FunctionDef,
                                                            ast.AsyncFunctionDef)) \
                else MODULE_DOC_LINES
            if lines > limit:
                long[f'{os.path.relpath(path, ROOT)}:{getattr(node, "name", "")}'] = lines
    assert not long, f'docstrings over their limit: {long}'


def test_the_readmes_map_of_the_section_names_what_each_file_defines():
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        text = f.read()
    section = text[text.index("## Where the section's code is"):]
    section = section[:section.index('\n## ', 1)]
    rows = [line for line in section.splitlines()
            if line.startswith('| ') and '`gluon_multigpu/' in line]
    assert len(rows) == 4, rows  # the step, the split, the Trainer, the text's loop
    for row in rows:
        cells = [c.strip() for c in row.strip('|').split('|')]
        path = cells[1].strip('`')
        names = [n.strip(' `') for n in cells[2].split(',')]
        with open(os.path.join(ROOT, path), encoding='utf-8') as f:
            defined = {node.name for node in ast.parse(f.read()).body
                       if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert set(names) <= defined, (path, set(names) - defined)

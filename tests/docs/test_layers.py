"""The structure of the package: floors that only go down, and sizes that fit a head.

The import rules are import-linter contracts in setup.cfg (docs/design.md says
why each floor is where it is); these tests run the tool on the package, show
that it catches an import running back up, and hold the size limits.
"""
import ast
import inspect
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
#: The longest the fit's epoch loop (``Training._fit``) may be: it reads like the book's (issue 51).
FIT_LOOP_LINES = 45
#: The longest prose of a module's (or class's) docstring and of a function's: the lines before
#: its first numpydoc section (``Parameters``, ``Returns``, ...), which carry the reference and
#: are not counted (issues 40 and 51).
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
    # The section reaching up to the machinery around it: the circle this layout removed.
    ('section/book.py', 'from ..machinery import training  # noqa', 'Floors only go down'),
    # The ground floor loading MXNet before the engine is set up.
    ('base/units.py', 'import mxnet  # noqa', 'loads no MXNet'),
    # One exercise using another.
    ('features/balance.py', 'from . import precision  # noqa', 'plug-in of train of its own'),
    # The installed package reaching into the lab, which is not installed.
    ('section/data.py', 'import lab.studies.sweep  # noqa', 'never imports the lab'),
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
    assert 'gluon_multigpu.section ' in drawing.stdout and 'lab.hosts ' in drawing.stdout
    for tree in (PACKAGE, LAB, os.path.join(ROOT, 'tools')):
        shutil.copytree(tree, tmp_path / os.path.basename(tree),
                        ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(os.path.join(ROOT, 'setup.cfg'), tmp_path / 'setup.cfg')
    with open(tmp_path / 'gluon_multigpu' / 'section' / 'steps.py', 'a', encoding='utf-8') as f:
        f.write('\n\ndef _late():\n    from ..checkpoints import checkpoint  # noqa\n')
    drawing = subprocess.run([sys.executable, str(tmp_path / 'tools' / 'imports.py')],
                             capture_output=True, text=True, timeout=120, check=False)
    assert drawing.returncode == 1, drawing.stdout
    assert 'UP: gluon_multigpu.section imports gluon_multigpu.checkpoints' in drawing.stdout


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


def test_the_fits_epoch_loop_reads_like_the_books():
    with open(os.path.join(PACKAGE, 'machinery', 'training.py'), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    training = next(node for node in tree.body
                    if isinstance(node, ast.ClassDef) and node.name == 'Training')
    fit = next(node for node in training.body
               if isinstance(node, ast.FunctionDef) and node.name == '_fit')
    assert any(isinstance(node, ast.For) for node in fit.body)  # the loop over the epochs
    lines = fit.end_lineno - fit.lineno + 1
    assert lines <= FIT_LOOP_LINES, f'Training._fit is {lines} lines, over {FIT_LOOP_LINES}'


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


#: The numpydoc section headers that end a docstring's prose (``Parameters`` over a rule of
#: dashes as long as the word): what follows is the reference, not counted.
SECTIONS = ('Parameters', 'Returns', 'Yields', 'Receives', 'Raises', 'Warns', 'Other Parameters',
            'Attributes', 'Methods', 'See Also', 'Notes', 'References', 'Examples')


def prose_lines(docstring):
    """The lines of ``docstring``'s prose: those before its first numpydoc section header, the
    blank lines at its end left out."""
    lines = inspect.cleandoc(docstring).split('\n')
    for i, (line, rule) in enumerate(zip(lines, lines[1:])):
        title = line.strip()
        if title in SECTIONS and set(rule.strip()) == {'-'} and \
                len(rule.strip()) == len(title):
            lines = lines[:i]
            break
    while lines and not lines[-1].strip():
        lines.pop()
    return len(lines)


def long_docstrings(source, where=''):
    """``{where:name: prose lines}`` of each docstring of ``source`` whose prose is over its limit
    (a function's ``FUNCTION_DOC_LINES``, a module's or class's ``MODULE_DOC_LINES``)."""
    long = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
            continue
        docstring = ast.get_docstring(node, clean=False)
        if docstring is None:
            continue
        lines = prose_lines(docstring)
        limit = FUNCTION_DOC_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
            else MODULE_DOC_LINES
        if lines > limit:
            long[f'{where}:{getattr(node, "name", "")}'] = lines
    return long


def test_no_docstring_is_longer_than_the_limit():
    long = {}
    for path in _sources():
        with open(path, encoding='utf-8') as f:
            long.update(long_docstrings(f.read(), os.path.relpath(path, ROOT)))
    assert not long, f'docstrings whose prose is over its limit: {long}'


def _docstring(prose, sections=''):
    return 'def f(x):\n    """' + '\n    '.join(prose + sections.split('\n')) + '\n    """\n'


def test_the_docstring_rule_counts_the_prose_only():
    twelve = [f'Line {i} of the prose.' for i in range(1, 13)]
    reference = ('\nParameters\n----------\nx : int\n' + '    What x is.\n' * 30
                 + '\nReturns\n-------\nint\n    Twice x.')
    # twelve lines of prose and a long reference: within the limit
    assert long_docstrings(_docstring(twelve, reference)) == {}
    # a thirteenth line of prose fails, with or without sections after it
    assert long_docstrings(_docstring(twelve + ['One more.'], reference)) == {':f': 13}
    assert long_docstrings(_docstring(twelve + ['One more.'])) == {':f': 13}
    # a section header is one only with its rule: a word alone on a line is prose
    assert long_docstrings(_docstring(twelve + ['Parameters'])) == {':f': 13}
    # a module's or class's prose may be 15 lines, not 16
    fifteen = '\n'.join(f'Line {i}.' for i in range(1, 16))
    assert long_docstrings(f'"""{fifteen}\n\nNotes\n-----\nMore.\n"""\n') == {}
    assert long_docstrings(f'class C:\n    """{fifteen}\n    One more.\n    """\n') == {':C': 16}


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

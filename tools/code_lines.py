"""Count the installed package's code: lines that hold a statement (issue 51's measure).

A line counts when Python's tokenizer finds a token on it that is not a comment, and it is
not part of a module's, class's or function's docstring; blank lines never count.

    python tools/code_lines.py              # per folder of gluon_multigpu, and the total
    python tools/code_lines.py --files      # per file, largest first
"""
import argparse
import ast
import collections
import io
import pathlib
import sys
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER}


def docstring_lines(tree):
    """The line numbers of every docstring in ``tree``."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source):
    """How many lines of ``source`` hold a statement."""
    docs, lines = docstring_lines(ast.parse(source)), set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in SKIPPED:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docs)
    return len(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--files', action='store_true', help='each file, largest first')
    p.add_argument('package', nargs='?', default=str(ROOT / 'gluon_multigpu'))
    args = p.parse_args(argv)
    root = pathlib.Path(args.package)
    counts = {path.relative_to(root): code_lines(path.read_text(encoding='utf-8'))
              for path in sorted(root.rglob('*.py'))}
    if args.files:
        rows = sorted(((str(k), v) for k, v in counts.items()), key=lambda kv: -kv[1])
    else:
        folders = collections.Counter()
        for path, n in counts.items():
            folders[str(path.parent) if len(path.parts) > 1 else '.'] += n
        rows = sorted(folders.items())
    for name, n in rows:
        print(f'{name:40s} {n:6d}')
    print(f'{"total":40s} {sum(counts.values()):6d}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

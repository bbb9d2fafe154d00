#!/usr/bin/env python3
"""Draw the imports between the package's rooms (and the lab's) from the source, and check them.

Every ``import`` and ``from ... import`` of every module of ``gluon_multigpu/``
and ``lab/`` is read with ``ast`` (those inside functions too), and each is
drawn as an arrow from the importing room (``cli``, ``section``, ``lab.studies``,
...) to the imported one. The floors are setup.cfg's (the import-linter
contracts: ``Floors only go down``, ``The lab's floors``), read from there, so
this drawing is a second, independent look at what ``lint-imports`` checks.
An arrow that goes up a floor, or between two rooms of one floor, or from the
package into the lab, is printed as such and makes the exit status 1.

    python tools/imports.py            # the drawing, and the arrows that break a floor
"""
import ast
import configparser
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def floors(root=ROOT):
    """The rooms, floor by floor from the top: the package's, then the lab's (setup.cfg)."""
    config = configparser.ConfigParser()
    config.read(os.path.join(root, 'setup.cfg'))
    found = []
    for name in ('importlinter:contract:floors', 'importlinter:contract:lab-floors'):
        layers = config[name]['layers'].split('\n')
        found += [[room.strip() for room in layer.split('|')] for layer in layers if layer.strip()]
    return found


def modules(root=ROOT):
    """``{module name: path}`` of every module of the package and the lab."""
    found = {}
    for top in ('gluon_multigpu', 'lab'):
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if name.endswith('.py'):
                    path = os.path.join(folder, name)
                    module = os.path.relpath(path, root)[:-3].replace(os.sep, '.')
                    found[module[:-len('.__init__')] if module.endswith('.__init__')
                          else module] = path
    return found


def imported(module, path):
    """The absolute names ``module`` (its file ``path``) imports, with their line numbers."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    package = module if path.endswith('__init__.py') else module.rpartition('.')[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                parts = parts[:len(parts) - node.level + 1]
                base = '.'.join(parts + ([base] if base else []))
            names += [(f'{base}.{alias.name}', node.lineno) for alias in node.names]
            names.append((base, node.lineno))
    return names


def room_of(name, rooms):
    """The room (the longest room name that is ``name`` or a parent of it), or None."""
    best = None
    for room in rooms:
        if (name == room or name.startswith(room + '.')) and (best is None or
                                                              len(room) > len(best)):
            best = room
    return best


def arrows(root=ROOT):
    """``{(from room, to room): [(module, line), ...]}`` over every import between two rooms."""
    rooms = [room for floor in floors(root) for room in floor]
    found = {}
    for module, path in modules(root).items():
        here = room_of(module, rooms)
        if here is None:
            continue
        for name, line in imported(module, path):
            there = room_of(name, rooms)
            if there is not None and there != here:
                found.setdefault((here, there), []).append((module, line))
    return found


def broken(root=ROOT):
    """The arrows that go up a floor, sideways within one, or from the package into the lab."""
    level = {room: i for i, floor in enumerate(floors(root)) for room in floor}
    bad = []
    for (here, there), where in sorted(arrows(root).items()):
        into_lab = here.startswith('gluon_multigpu') and there.startswith('lab')
        same_kind = here.split('.')[0] == there.split('.')[0]
        if into_lab or (same_kind and level[there] <= level[here]):
            bad.append((here, there, where))
    return bad


def drawing(root=ROOT):
    """The floors from the top, each room with the rooms it imports (and how many imports)."""
    found, lines = arrows(root), []
    for floor in floors(root):
        for room in floor:
            out = sorted((there, len(where)) for (here, there), where in found.items()
                         if here == room)
            names = [t.split('.', 1)[1] if t.split('.')[0] == room.split('.')[0] else
                     t.replace('gluon_multigpu.', 'gm.') for t, _ in out]
            lines.append(f'{room:<30} -> ' + (', '.join(f'{name} ({n})' for name, (_, n)
                                                         in zip(names, out)) or 'nothing'))
        lines.append('')
    return '\n'.join(lines).rstrip()


def main():
    print(drawing())
    bad = broken()
    for here, there, where in bad:
        module, line = where[0]
        print(f'UP: {here} imports {there} ({module}, line {line}; {len(where)} in all)')
    print(f'{len(bad)} arrow(s) against the floors')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())

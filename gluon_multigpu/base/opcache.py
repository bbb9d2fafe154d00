"""MXNet's operator functions kept from one process to the next: ``import mxnet`` in half the time.

As MXNet 1.9.1 loads, it writes the Python source of a function for each of
its operators (about 2,300: ndarray, symbol, numpy), from what its library
says of each, and compiles it: about 1 s of the 1.7 s its import takes. The
first process keeps the compiled functions in a file of the user's cache
folder (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``gluon-multigpu``), named
by MXNet's library file, its version and Python's bytecode; later processes
run them instead. What differs between processes, each operator's handle
(an address written into its function as a number), is put in as each
function is made. A file that is missing, torn, foreign or not the user's
own is not read (it is written anew where it can be); a folder that cannot
be written changes nothing but the time. ``GLUON_MULTIGPU_OP_CACHE=0``
turns it off.
"""
import contextlib
import hashlib
import importlib.util
import marshal
import os
import sys
import types

__all__ = ['install', 'save', 'write_table', 'stats', 'cache_path', 'ENV', 'OnLoad', 'on_load']

#: The environment variable that turns the cache off (``0``).
ENV = 'GLUON_MULTIGPU_OP_CACHE'
#: Bump when what a file holds changes: a file of another format is another file.
FORMAT = 1
#: The generators of MXNet's register modules, by the module that makes the functions.
_GENERATORS = {'mxnet.ndarray.register': '_generate_ndarray_function_code',
               'mxnet.symbol.register': '_generate_symbol_function_code'}
_STATE = {'path': None, 'read': {}, 'made': {}, 'hits': 0, 'misses': 0, 'installed': False}


def stats():
    """This process's use of the cache: its file, functions taken from it and made anew."""
    return {k: _STATE[k] for k in ('path', 'hits', 'misses', 'installed')}


def cache_path(library, version):
    """The cache file for MXNet's library file ``library`` (its size and time in the name), in
    the user's cache folder; None where that is not known (no home folder, as XDG says)."""
    if not os.path.isabs(root := os.environ.get('XDG_CACHE_HOME') or
                         os.path.join(os.path.expanduser('~'), '.cache')):
        return None
    info = os.stat(library)
    key = repr((os.path.realpath(library), info.st_size, info.st_mtime_ns, version, FORMAT,
                importlib.util.MAGIC_NUMBER, sys.implementation.cache_tag))
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return os.path.join(root, 'gluon-multigpu', f'mxnet-ops-{digest}.marshal')


def _mine(name):
    """Whether ``name`` is this user's and nobody else may write it."""
    info = os.stat(name)
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _typed(value, kinds):
    """Whether ``value`` is a tuple of one instance of each of ``kinds``, in order."""
    return (isinstance(value, tuple) and len(value) == len(kinds) and
            all(map(isinstance, value, kinds)))


def _read(path):
    """The entries of the file at ``path``: {} if it is missing, torn, foreign or not owned."""
    with contextlib.suppress(OSError, EOFError, ValueError, TypeError):
        if _mine(path) and _mine(os.path.dirname(path)):  # the file and its folder
            with open(path, 'rb') as f:
                table = marshal.load(f)
            if isinstance(table, dict) and all(_typed(k, (str, str, str)) and _typed(
                    v, (types.CodeType, str, int)) for k, v in table.items()):
                return table
    return {}


def _with_handle(code, old, new):
    """``code`` with the number ``old`` (a handle) made ``new``, in nested code too."""
    if old == new:
        return code
    consts = tuple(new if type(c) is int and c == old  # pylint: disable=unidiomatic-typecheck
                   else _with_handle(c, old, new) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_consts=consts)


def _cached(make):
    """``make`` (a register module's function maker) taking its functions from the cache."""
    kind, scope = make.__module__, make.__globals__
    if (generate := scope.get(_GENERATORS.get(kind, ''))) is None:
        return make  # not a maker this module knows: MXNet's own, untouched

    def cached(handle, name, func_name):
        key, now = (kind, name, func_name), handle.value
        if (entry := _STATE['read'].get(key)) is not None:
            _STATE['hits'] += 1
        else:
            text, doc = generate(handle, name, func_name)
            _STATE['made'][key] = entry = (compile(text, '<string>', 'exec'), doc, now)
            _STATE['misses'] += 1
        code, doc, then = entry
        exec(_with_handle(code, then, now), scope, local := {})  # pylint: disable=exec-used
        function = local[func_name]
        function.__name__, function.__doc__ = func_name, doc
        function.__module__ = kind.rsplit('.', 1)[0]
        return function
    return cached


def _patch(execute, base):
    """Run ``mxnet.base`` (``execute``), then make its registering functions use the cache."""
    execute(base)
    try:
        _STATE['path'] = cache_path(base._LIB._name, base.__version__)  # pylint: disable=protected-access
    except (OSError, AttributeError, TypeError):
        return
    _STATE['read'] = _read(_STATE['path']) if _STATE['path'] else {}
    init_op, init_np_op = base._init_op_module, base._init_np_op_module  # pylint: disable=protected-access

    def init_op_module(root_namespace, module_name, make_op_func):
        return init_op(root_namespace, module_name, _cached(make_op_func))

    def init_np_op_module(root_module_name, np_module_name, mx_module_name, make_op_func):
        return init_np_op(root_module_name, np_module_name, mx_module_name, _cached(make_op_func))
    base._init_op_module, base._init_np_op_module = init_op_module, init_np_op_module  # pylint: disable=protected-access
    _STATE['installed'] = True


class OnLoad:
    """A ``sys.meta_path`` finder for the module ``name`` alone, gone once it has found it:
    ``first()`` (if given) before the spec is looked for, then the module is run as
    ``run(execute, module)`` says (``execute``: as its own loader runs it)."""

    def __init__(self, name, run, first=None):
        self.name, self.run, self.first = name, run, first

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        if name != self.name:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        if self.first is not None:
            self.first()
        spec = importlib.util.find_spec(name)  # the finders after this one, as without it
        if spec is not None and hasattr(spec.loader, 'exec_module'):
            execute = spec.loader.exec_module
            spec.loader.exec_module = lambda module: self.run(execute, module)
        return spec


def on_load(name, run, first=None):
    """Put an ``OnLoad`` finder first on ``sys.meta_path`` unless ``name`` is loaded or one is
    there already; return whether ``name`` is still to load."""
    if name in sys.modules:
        return False
    if not any(isinstance(f, OnLoad) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, OnLoad(name, run, first))
    return True


def install():
    """Before MXNet loads: have its operator functions come from the cache; False if not."""
    return os.environ.get(ENV) != '0' and on_load('mxnet.base', _patch)


def write_table(path, table):
    """Write ``table`` to the cache file ``path`` through the output layer (``atomic``: whole or
    not at all, what a killed writer left removed first); False where it cannot be written."""
    from ..filesafety import atomic  # pylint: disable=import-outside-toplevel  (only when writing)
    folder = os.path.dirname(path)
    with contextlib.suppress(OSError, ValueError):
        atomic.makedirs(folder, 0o700)
        if _mine(folder):
            atomic.write_file(path, marshal.dumps(table), mode=0o600)
            return True
    return False


def save():
    """After MXNet loaded: write the functions made anew to the cache file; whether it wrote."""
    made, path, read = _STATE['made'], _STATE['path'], _STATE['read']
    _STATE['made'], _STATE['read'] = {}, {}
    return bool(made) and path is not None and write_table(path, {**read, **made})

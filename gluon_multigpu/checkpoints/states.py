"""A Trainer's optimizer state as a file of numbers only: a checkpoint never holds code.

MXNet's ``Trainer.save_states`` pickles the updaters' states (and the
optimizer itself), and ``Trainer.load_states`` unpickles whatever the file
holds: a planted file would run its code on resume. Here the state is
written with ``mx.nd.save``, MXNet's array file (names and arrays, nothing
else), and read back with ``mx.nd.load``. Reading checks every name, index
and shape against the Trainer's parameters before it changes anything.

Notes
-----
The file's arrays:

- ``version``: 2, which keys each state by its parameter's place in
  ``net.collect_params()``. Version 1 files (no ``version``) keyed it by the
  Trainer's index, which follows the parameters' names, whose counters are
  global to the process (two copies of a network can sort ``conv9_`` and
  ``conv10_`` differently); they are still read by that index.
- ``layout``: int64 rows ``(index, kind, length, numpy)`` per parameter; kind 0
  is no state (plain SGD), 1 one array, 2 a tuple of ``length`` entries, each
  an array or None (momentum and a float32 master copy, say); ``numpy`` is 1
  when the arrays were ``mxnet.numpy`` arrays.
- ``state:I`` (kind 1) and ``state:I:K`` (entry K of kind 2): the arrays.
- ``counts``: int64 rows ``(device, index, updates)``, the optimizer's update
  count per device and parameter; ``num_update``: its overall count.
"""
import numpy as onp

from .. import _mxnet  # noqa: F401  (MXNet with the book's NumPy semantics)
import mxnet as mx
from mxnet import nd

from ..errors import CheckpointError

__all__ = ['save_trainer_states', 'load_trainer_states']

#: Entries a tuple state may have (SGD with a master copy: 2, Adam: 2, ...).
MAX_ENTRIES = 8
_NO_STATE, _ARRAY, _TUPLE = 0, 1, 2


def _updaters(trainer):
    """The Trainer's updaters (one per device, or the kvstore's), its kvstore set up first."""
    # pylint: disable=protected-access
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return [trainer._kvstore._updater] if trainer._update_on_kvstore else trainer._updaters


def _is_numpy(array):
    return isinstance(array, mx.np.ndarray)


def _to_file(array):
    """A legacy NDArray on the CPU holding ``array`` (what ``mx.nd.save`` writes)."""
    return (array.as_nd_ndarray() if _is_numpy(array) else array).as_in_context(mx.cpu())


#: Version 2 keys each state by its parameter's place in the network; version 1
#: (no ``version`` table) by the Trainer's index, which follows the sorted names.
VERSION = 2


def _places(net, trainer):
    """For each of ``trainer``'s indices, its parameter's place in ``net.collect_params()``.

    A Trainer orders its parameters by their names, and the names carry
    counters global to the process (``dense9_`` then ``dense10_``): two
    copies of one network can order alike-shaped parameters differently.
    The place in the network (its structure's order) is the same for both.
    """
    place_of = {id(param): place for place, param in enumerate(net.collect_params().values())}
    for param in trainer._params:  # pylint: disable=protected-access
        if id(param) not in place_of:
            raise CheckpointError(f'the Trainer updates {param.name}, which is not a parameter '
                                  'of the network given')
    return [place_of[id(param)] for param in trainer._params]  # pylint: disable=W0212


def save_trainer_states(net, trainer, path):
    """Write ``trainer``'s optimizer state for ``net``'s parameters to ``path`` (see the
    module's description)."""
    updater, places = _updaters(trainer)[0], _places(net, trainer)
    arrays, layout = {}, []
    for index, state in sorted(updater.states.items(), key=lambda item: str(item[0])):
        if not isinstance(index, int) or not 0 <= index < len(places):
            raise CheckpointError(f'the optimizer state is keyed by {index!r}, not by a '
                                  'parameter index; a checkpoint cannot save it')
        index = places[index]
        if state is None:
            layout.append((index, _NO_STATE, 0, 0))
        elif isinstance(state, nd.NDArray):
            arrays[f'state:{index}'] = _to_file(state)
            layout.append((index, _ARRAY, 0, int(_is_numpy(state))))
        elif isinstance(state, (tuple, list)) and len(state) <= MAX_ENTRIES and all(
                s is None or isinstance(s, nd.NDArray) for s in state):
            arrays.update({f'state:{index}:{k}': _to_file(s)
                           for k, s in enumerate(state) if s is not None})
            layout.append((index, _TUPLE, len(state),
                           int(any(_is_numpy(s) for s in state if s is not None))))
        else:
            raise CheckpointError(f'the optimizer state of parameter {index} is a '
                                  f'{type(state).__name__}, which a checkpoint cannot save')
    optimizer = updater.optimizer
    counts = sorted((device, places[i], n) for device, per_index in
                    optimizer._all_index_update_counts.items()  # pylint: disable=protected-access
                    for i, n in per_index.items()
                    if isinstance(i, int) and 0 <= i < len(places) and isinstance(device, int))
    for name, rows in (('layout', layout), ('counts', counts), ('num_update', [optimizer.num_update]),
                       ('version', [VERSION])):
        arrays[name] = nd.array(onp.array(rows, dtype='int64').reshape(-1), dtype='int64')
    nd.save(path, arrays)


def _rows(arrays, name, width):
    """The int64 table ``name`` of the file as rows of ``width`` (raises if it is not one)."""
    table = arrays.pop(name, None)
    if table is None or table.ndim != 1 or table.dtype != onp.int64 or table.size % width:
        raise CheckpointError(f'its table {name} is missing or not {width} whole numbers a row')
    return table.asnumpy().reshape(-1, width).tolist()


def _decode(arrays, params):
    """Return ``(states, counts, num_update)`` from the loaded ``arrays``, checked."""
    states = {}
    for index, kind, length, numpy in _rows(arrays, 'layout', 4):
        if not 0 <= index < len(params) or index in states:
            raise CheckpointError(f'it holds a state for parameter {index}, and this network '
                                  f'has parameters 0 to {len(params) - 1}')
        if kind not in (_NO_STATE, _ARRAY, _TUPLE) or not 0 <= length <= MAX_ENTRIES or \
                numpy not in (0, 1):
            raise CheckpointError(f'its layout row for parameter {index} is not one it writes')

        def take(name, index=index, numpy=numpy):
            array = arrays.pop(name)
            if array.shape != params[index].shape:
                raise CheckpointError(f'its array {name} has shape {array.shape}, and parameter '
                                      f'{params[index].name} has {params[index].shape}')
            return array.as_np_ndarray() if numpy else array
        if kind == _NO_STATE:
            states[index] = None
        elif kind == _ARRAY:
            if f'state:{index}' not in arrays:
                raise CheckpointError(f'its array state:{index} is missing')
            states[index] = take(f'state:{index}')
        else:
            states[index] = tuple(take(f'state:{index}:{k}') if f'state:{index}:{k}' in arrays
                                  else None for k in range(length))
    counts = {}
    for device, index, updates in _rows(arrays, 'counts', 3):
        if not 0 <= index < len(params) or updates < 0 or device < 0:
            raise CheckpointError(f'its update count {updates} for parameter {index} on device '
                                  f'{device} is out of range')
        counts.setdefault(device, {})[index] = updates
    total = _rows(arrays, 'num_update', 1)
    if len(total) != 1 or total[0][0] < 0:
        raise CheckpointError('its overall update count is not one number of 0 or more')
    if arrays:
        raise CheckpointError(f'it holds arrays it does not write ({", ".join(sorted(arrays))})')
    return states, counts, total[0][0]


def _copy(state):
    return tuple(map(_copy, state)) if isinstance(state, tuple) else \
        None if state is None else state.copy()


def _to_trainer(net, trainer, arrays):
    """The parameters in the file's order (its ``version``), and the Trainer's index of each."""
    params = trainer._params  # pylint: disable=protected-access
    if 'version' not in arrays:  # version 1: written before states were keyed by place
        return params, list(range(len(params)))
    if (rows := _rows(arrays, 'version', 1)) != [[VERSION]]:
        raise CheckpointError(f'it is of version {rows}, and this package reads 1 and {VERSION}')
    placed = list(net.collect_params().values())
    index_of = {id(param): i for i, param in enumerate(params)}
    return placed, [index_of.get(id(param)) for param in placed]


def _remap(states, counts, indices):
    """``states`` and ``counts`` keyed by the Trainer's indices instead of the file's."""
    for key in list(states) + [k for per in counts.values() for k in per]:
        if indices[key] is None:
            raise CheckpointError(f'it holds a state for parameter {key} of the network, which '
                                  'this Trainer does not update')
    return ({indices[k]: state for k, state in states.items()},
            {device: {indices[k]: n for k, n in per.items()} for device, per in counts.items()})


def load_trainer_states(net, trainer, path):
    """Give ``trainer`` the optimizer state for ``net`` written to ``path`` by
    ``save_trainer_states``.

    Raises ``CheckpointError`` saying what is wrong with a file that is not
    one (MXNet's reader refuses what is not an array file); nothing in the
    file is executed, and the Trainer is changed only once all of it checked out.
    """
    try:
        arrays = nd.load(path)
    except mx.base.MXNetError:
        raise CheckpointError('it is not an array file MXNet can read') from None
    if not isinstance(arrays, dict):
        raise CheckpointError('it holds a list of arrays, not named ones')
    params, indices = _to_trainer(net, trainer, arrays)
    states, counts, num_update = _decode(arrays, params)
    states, counts = _remap(states, counts, indices)
    for i, updater in enumerate(_updaters(trainer)):
        updater.states = states if i == 0 else {k: _copy(s) for k, s in states.items()}
        updater.states_synced = dict.fromkeys(states, False)  # moved to each device on first use
        optimizer = updater.optimizer
        for device, per_index in counts.items():  # in place: the current device's dict stays
            optimizer._all_index_update_counts.setdefault(  # pylint: disable=protected-access
                device, {}).update(per_index)
        optimizer.num_update = max(optimizer.num_update, num_update)

"""The parameter-server model's table of docs/distributed.md ("What to expect: a model").

A maintainer's tool, not part of the package. It computes, with
``lab.studies.scaling_model.worker_projection``, what the model predicts for
ResNet-18 on one GPU per worker at the book's speed, with 4 servers, on
10 Gbit/s and 100 Gbit/s links, and writes the inputs and the rows to
``docs/results/worker-projection.json`` (with this machine and the date, as
every results file records them), from which ``tools/figures.py`` checks the
table. Nothing is timed: the figures follow from the inputs below.

    python tools/projection.py
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a file: the checkout's package
    sys.path.insert(0, ROOT)

from gluon_multigpu.filesafety.atomic import atomic_write  # noqa: E402
from gluon_multigpu.base.machine import stamp  # noqa: E402
from lab.studies.network_model import (  # noqa: E402
    GRAD_BYTES, LARGEST_KEY_BYTES, PAYLOAD)
from lab.studies.scaling_model import worker_projection  # noqa: E402

PATH = os.path.join(ROOT, 'docs', 'results', 'worker-projection.json')
#: The book's ResNet-18 speed on one GPU (images/s) and its batch of a step.
BOOK_IMAGES_PER_S = 4478
BOOK_BATCH = 256
#: Parameter servers, worker counts and link rates (Gbit/s) of the table.
SERVERS = 4
WORKERS = (1, 2, 4, 8, 16)
LINKS_GBIT = (10, 100)


def table():
    """The inputs and, per link rate, ``worker_projection``'s rows."""
    t_step = BOOK_BATCH / BOOK_IMAGES_PER_S
    model = 'resnet18'
    links = {}
    for gbit in LINKS_GBIT:
        payload_gbps = gbit / 8 * PAYLOAD  # GB/s of TCP payload each way
        links[f'{gbit}gbit'] = {
            'payload_gbps': payload_gbps,
            'rows': worker_projection(t_step, GRAD_BYTES[model], list(WORKERS), SERVERS,
                                      payload_gbps, largest_bytes=LARGEST_KEY_BYTES[model])}
    return {'model': model, 'book_images_per_s': BOOK_IMAGES_PER_S, 'batch': BOOK_BATCH,
            't_step_s': t_step, 'grad_bytes': GRAD_BYTES[model],
            'largest_bytes': LARGEST_KEY_BYTES[model], 'servers': SERVERS,
            'payload_share': PAYLOAD, 'links': links}


def main():
    with atomic_write(PATH) as f:
        json.dump({**table(), **stamp()}, f, indent=2)
        f.write('\n')
    print(f'written: {os.path.relpath(PATH, ROOT)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

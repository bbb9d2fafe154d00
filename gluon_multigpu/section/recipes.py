"""Each model's measured settings: one recipe used by ``train`` and by the command line.

A recipe says how a network trains well here: its initialiser, its learning
rate as a function of the whole batch, the batch per device the scripts use,
and how many steps MXNet may run behind Python. The networks the package
builds carry theirs (``net.recipe``); ``train`` takes every setting not given
from it, so ``gm.train(gm.simple_cnn(), ...)`` trains as the command line's
``--model simple-cnn`` does. A network of your own gets the book's settings
(``BOOK``) unless you give it a recipe.
"""
from dataclasses import dataclass
from typing import Callable, Optional

# MAX_IN_FLIGHT, the steps the engine may run ahead of Python: 1 was as fast as unbounded and
# lets Ctrl-C, progress and the memory act within a step (docs/results.md, scripts/inflight.py).
from ..base.engine import MMAP_THRESHOLD
from ..base.values import MAX_IN_FLIGHT

__all__ = ['Recipe', 'RECIPES', 'BOOK', 'recipe_of', 'MAX_IN_FLIGHT']


@dataclass(frozen=True)
class Recipe:
    """How a model trains: the defaults ``train`` and the scripts take for it.

    Attributes
    ----------
    name : str
        The model's name on the command line (``--model``).
    per_device : int
        Samples per device in a batch (the scripts' default ``--batch-size`` is this times
        the devices).
    lr : callable
        The learning rate for a whole batch of ``B`` samples: ``lr(B)``.
    initializer : callable
        Returns a new MXNet initializer.
    max_in_flight : int or None
        Steps the engine may run behind Python (None: unbounded, the book's loop).
    describe : str
        The settings in words, for ``--help``.
    static_alloc : bool
        Hybridize with ``static_alloc`` (each block's buffers kept between calls).
    mmap_threshold : int
        Bytes from which glibc maps a block and hands it back when freed, set as the network
        is compiled (``engine.freed_blocks_from``; the engine's ``MMAP_THRESHOLD`` unless lower).
    """
    name: str
    per_device: int
    lr: Callable[[int], float]
    initializer: Callable[[], object]
    max_in_flight: Optional[int]
    describe: str
    #: Compile with ``static_alloc`` (each block's buffers kept between calls): ResNet-18's
    #: steps gain by it, the small CNN's not (docs/results.md, "Memory")
    static_alloc: bool = False
    #: 1 MiB for ResNet-18: 0.97x its peak memory, no speed change seen; the small CNN's
    #: steps lost 12% with it on an Intel Xeon (tools/levers.py, docs/results.md "Memory")
    mmap_threshold: int = MMAP_THRESHOLD

    def batch_size(self, num_devices):
        """The recipe's whole batch on ``num_devices`` devices."""
        return self.per_device * num_devices


def _normal():
    from mxnet import init  # pylint: disable=import-outside-toplevel
    return init.Normal(sigma=0.01)


def _uniform():
    from mxnet import init  # pylint: disable=import-outside-toplevel
    return init.Uniform(0.07)


#: Per model. ResNet-18 keeps the book's settings (batch 256 per GPU, lr 0.1 per 256 samples,
#: Normal(0.01), which BatchNorm rescales); the simple CNN's were measured (docs/guide.md):
#: without BatchNorm, Normal(0.01) leaves it near chance for epochs, MXNet's Uniform(0.07)
#: (the lab's) does not. ResNet-18 compiles with ``static_alloc``: with one scratch copy a
#: thread (``engine.CPU_COPIES``) 1.06x its images/s at 1.13x its memory (tools/levers.py,
#: interval 1.01 to 1.12; block by block, before it compiled as one graph); the small CNN
#: gained nothing established by it.
RECIPES = {'resnet18': Recipe('resnet18', 256, lambda batch: 0.1 * batch / 256, _normal,
                              MAX_IN_FLIGHT, '256 per device, lr 0.1 per 256 samples (the book: '
                              'batch 512 and lr 0.2 on two GPUs)', static_alloc=True,
                              mmap_threshold=1 << 20),
           'simple-cnn': Recipe('simple-cnn', 64, lambda batch: 0.3, _uniform, MAX_IN_FLIGHT,
                                '64 per device, lr 0.3 (the Gluon multi-GPU lab)')}
#: A network without a recipe: the book's section as printed (lr 0.1 at batch 256 per device).
BOOK = Recipe('book', 256, lambda batch: 0.1, _normal, None,
              "the book's: Normal(0.01), lr 0.1, steps in flight unbounded")


def recipe_of(net):
    """The recipe ``net`` carries (``net.recipe``), or ``BOOK``."""
    recipe = getattr(net, 'recipe', None)
    return recipe if isinstance(recipe, Recipe) else BOOK

"""``python -m gluon_multigpu.doctor``: the doctor of ``gluon_multigpu.cli.doctor``."""
from .cli.doctor import main, start

__all__ = ['main', 'start']

if __name__ == '__main__':
    start()

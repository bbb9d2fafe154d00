"""Durations as the package's lines write them."""

__all__ = ['duration']


def duration(seconds):
    """``seconds`` as a short text: ``45 s``, ``12 min``, ``3.2 h``."""
    return (f'{seconds:.0f} s' if seconds < 90 else
            f'{seconds / 60:.0f} min' if seconds < 90 * 60 else f'{seconds / 3600:.1f} h')


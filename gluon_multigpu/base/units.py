"""Durations and sizes as the package's lines write them."""

__all__ = ['duration', 'size']


def duration(seconds):
    """``seconds`` as a short text: ``45 s``, ``12 min``, ``3.2 h``."""
    return (f'{seconds:.0f} s' if seconds < 90 else
            f'{seconds / 60:.0f} min' if seconds < 90 * 60 else f'{seconds / 3600:.1f} h')


def size(num_bytes):
    """``num_bytes`` as ``1.2 GB`` or ``350 MB`` (1 GB = 1e9 bytes)."""
    return f'{num_bytes / 1e9:.1f} GB' if num_bytes >= 1e9 else f'{num_bytes / 1e6:.0f} MB'

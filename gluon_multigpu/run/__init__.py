"""What a long run needs: engine settings, checkpoints, stopping, progress, safe files.

``engine`` loads no MXNet: it configures MXNet before it loads.
"""

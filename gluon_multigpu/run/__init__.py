"""What a long run needs: checkpoints, stopping, progress, safe files."""

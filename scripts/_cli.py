"""What the scripts share: an argument parser whose errors are one line and exit status 2."""
import argparse


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` that reports a bad argument in one line (no usage block), status 2."""

    def error(self, message):
        self.exit(2, f'{self.prog}: error: {message} (see --help)\n')

"""The option parser of the commands that take ``--options`` (``python -m opendit_lite.plan``,
scripts/*.py): argparse's own mistakes (a missing option, a value that is not a number, an unknown
option) as one ConfigError paragraph, which ``script_main`` ends with exit code 2, instead of
argparse's usage block."""

import argparse

from ..errors import ConfigError


class OptionParser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(f"{message}. Run {self.prog} --help for the options.")

"""Errors every command shares, kept apart from the command line so that the modules
behind the commands can raise them without importing ``cli``."""


class UsageError(Exception):
    """Bad input (a flag, a file, a config): printed as one line, exit code 2."""


EXIT_USAGE = 2

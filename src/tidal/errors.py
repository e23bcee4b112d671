"""The one base class for errors a user can cause and fix (a config, a checkpoint, a request).

The command line prints such an error as one line naming what to fix and exits with status 2;
anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A bad input from the user: the message says what is wrong and what to change."""

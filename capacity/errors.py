"""The one exception type the CLI turns into a one-line message and exit status 2."""


class CapacityError(Exception):
    """A user-facing problem: bad input, unknown name, a model that does not fit.

    The message is one line that says what is wrong and how to fix it.
    """

"""The toolkit's error types: a message a person can act on (no traceback)."""
import click


class ToolkitError(click.ClickException):
    """Raised for every expected failure (bad source, patch does not apply, build failed, ...).

    It is a click.ClickException, so the command line prints ``Error: <message>`` and exits 1;
    library callers can catch it like any exception.
    """

    exit_code = 1


class ToolError(RuntimeError):
    """A built llama.cpp tool is missing or failed (the eval and bench catch it per run)."""


class ToolNotFound(ToolError, ToolkitError):
    """A built llama.cpp tool that is not there: a ToolError to the eval and bench, a ToolkitError
    (``Error: <message>``, exit 1) to the build commands."""

    def __init__(self, message: str):
        ToolkitError.__init__(self, message)

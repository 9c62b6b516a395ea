"""The one error type of the toolkit: a message a person can act on (no traceback)."""
import click


class ToolkitError(click.ClickException):
    """Raised for every expected failure (bad source, patch does not apply, build failed, ...).

    It is a click.ClickException, so the command line prints ``Error: <message>`` and exits 1;
    library callers can catch it like any exception.
    """

    exit_code = 1

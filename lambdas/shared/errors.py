"""Errors the state machine catches by name (Lambda reports the exception class as `errorType`)."""


class InvalidRequest(ValueError):  # noqa: N818 - the name is the error the state machine and users see
    """The execution input cannot be run; the message lists every problem and how to fix it."""

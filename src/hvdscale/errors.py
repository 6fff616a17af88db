"""Errors that are the user's to fix: printed as one message without a traceback."""


class UserError(Exception):
    """Bad input (a file, key or sample): the message names it and says what was expected."""


class DataError(UserError):
    """A data file is missing, truncated, corrupt or fails validation."""


class ConfigError(UserError, ValueError):
    """A config value is invalid; the message names the key, the value and what is allowed."""

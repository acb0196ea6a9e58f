"""The one configuration error type of the project."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Invalid configuration. A service refuses to start on it and names the violated rule.

    Attributes:
        field: the setting (flag name without dashes, or a dotted path into a config file).
        value: the offending value, as given.
        reason: the rule it violates, e.g. ``"0 <= pause_target <= pause_threshold"``.
    """

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid configuration: {field}={value!r}: {reason}")

    def __reduce__(self):
        # Rebuilt from its three parts, not from the message: a ConfigError raised in a worker process
        # (a process pool, a multiprocessing child) reaches the parent intact instead of breaking the pool.
        return (type(self), (self.field, self.value, self.reason))

"""The error of bad usage or configuration, raised wherever a run's inputs are checked (the
spec builder, the CLI, a host) and printed by the CLI as one line, `trainctl: ...`, exit 2."""

from __future__ import annotations


class UsageError(Exception):
    """Bad usage or configuration: printed as `trainctl: ...`, exit 2."""

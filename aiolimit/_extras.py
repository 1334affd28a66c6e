"""The optional integrations' dependencies: which extra installs each.

>>> try:
...     import httpx
... except ImportError as exc:
...     raise missing_extra("aiolimit.httpx", "httpx") from exc
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "missing_extra"]

DISTRIBUTION = "aiolimit-redis"
"""The distribution's name on the package index, as in pyproject.toml (the import name is
always ``aiolimit``; "aiolimit" on the index is an unrelated project): the one place the
install lines of the extras take it from."""


def missing_extra(module: str, extra: str) -> ImportError:
    """The error of an integration whose extra is not installed."""
    return ImportError(f"{module} needs the {extra!r} extra: pip install '{DISTRIBUTION}[{extra}]'")

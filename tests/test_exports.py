"""Every public name of ``aiolimit`` is in the API reference."""

from __future__ import annotations

import pytest
from import_graph import ROOT

import aiolimit

DOCS = ROOT.parent / "docs"


def test_every_public_name_is_in_the_api_reference() -> None:
    reference = (DOCS / "api.md").read_text(encoding="utf-8")
    assert "::: aiolimit.errors\n" in reference  # (the errors, all of them, on one page)
    on_their_own = [n for n in aiolimit.__all__ if n not in aiolimit.errors.__all__]
    missing = [n for n in on_their_own if f"::: aiolimit.{n}\n" not in reference]
    assert missing == ["__version__"]


@pytest.mark.parametrize("name", ["Grant", "Refusal"])
def test_what_acquired_attempts_holds_is_public(name: str) -> None:
    assert name in aiolimit.__all__
    assert getattr(aiolimit, name) is getattr(aiolimit.backends, name)

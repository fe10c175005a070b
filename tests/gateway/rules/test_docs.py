"""docs/rules.md lists exactly the functions the engine has (a new function needs its doc
line; a documented one must exist)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.rules.functions import FUNCTIONS

DOC = Path(__file__).parents[3] / "docs" / "rules.md"


def test_documented_functions_are_the_registered_ones() -> None:
    text = DOC.read_text()
    section = text.split("## Functions", 1)[1].split("Not implemented", 1)[0]
    documented = set(re.findall(r"`([a-z_0-9]+)`", section)) - {"second", "millisecond",
                                                                "microsecond", "nanosecond"}
    documented = {d for d in documented if not d.endswith("_trim") and d not in (
        "notrim", "all", "leading", "trailing")}
    assert documented == set(FUNCTIONS), (sorted(documented - set(FUNCTIONS)),
                                          sorted(set(FUNCTIONS) - documented))

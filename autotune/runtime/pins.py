"""$AUTOTUNE_PIN: tactics forced per problem, parsed as data (nothing is evaluated)."""
from __future__ import annotations

import json
from typing import Iterable

from autotune.core import settings
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, parse_tactic

PIN_ENV = settings.PIN


def parse_pins(text: str) -> dict[str, Tactic]:
    """$AUTOTUNE_PIN: JSON {"<problem key>" | "*": tactic}, or `KEY=family[k=v,...]` items
    separated by ';'."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"${PIN_ENV} is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"${PIN_ENV} must map problem keys to tactics")
        items: Iterable = doc.items()
    else:
        items = []
        for part in filter(None, (p.strip() for p in text.split(";"))):
            key, eq, tac = part.partition("=")
            if not eq:
                raise ValueError(f"${PIN_ENV} item {part!r} is not KEY=family[k=v,...]")
            items.append((key.strip(), tac))
    out = {}
    for key, tac in items:
        if key != "*":
            try:
                Problem.from_key(key)
            except ValueError as e:
                raise ValueError(f"${PIN_ENV}: {e}") from None
        try:
            out[key] = parse_tactic(tac)
        except (ValueError, TypeError) as e:
            raise ValueError(f"${PIN_ENV}: {e}") from None
    return out




def check_star_pin(pin: Tactic, problems: Iterable[Problem], usable) -> None:
    """The `*` pin is refused (ValueError) when it could pin nothing: its family is unknown or its
    parameters invalid for the family, or it fits none of `problems` (the problems the dispatcher
    serves at start) although there are some. `usable(problem, tactic)` -> why not, or None.
    A `*` pin that fits some problems but not others is skipped for those (counted)."""
    from autotune.tactics import registry
    why = registry.validate(pin.family, pin.params)
    if why:
        raise ValueError(f"${PIN_ENV} / pins: cannot pin * to {pin}: {why}")
    problems = list(problems)
    if not problems:
        return
    whys = {p.key: usable(p, pin) for p in problems}
    if all(whys.values()):
        key, first = next(iter(whys.items()))
        raise ValueError(f"${PIN_ENV} / pins: * pin {pin} fits none of the {len(problems)} problem(s) served "
                         f"(e.g. {key}: {first})")

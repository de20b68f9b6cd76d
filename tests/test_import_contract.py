"""The contract "the runtime and the engine name no family" covers every module under
autotune.tactics, a family added later included: only the shared interface (base, scratch,
registry) is let through (lint-imports itself runs in tests/test_architecture.py)."""
from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERFACE = {"autotune.tactics.base", "autotune.tactics.scratch", "autotune.tactics.registry"}


def _contract() -> configparser.SectionProxy:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    return cfg["importlinter:contract:runtime-names-no-family"]


def _lines(value: str) -> list[str]:
    return [x.strip() for x in value.splitlines() if x.strip()]


def test_the_whole_tactics_package_is_forbidden_to_the_runtime_and_engine():
    c = _contract()
    assert c["type"] == "forbidden"
    assert set(_lines(c["source_modules"])) == {"autotune.runtime", "autotune.engine"}
    assert _lines(c["forbidden_modules"]) == ["autotune.tactics"]      # no family listed by hand
    assert c.get("allow_indirect_imports", "False") == "False"


def test_only_the_interface_is_let_through():
    ignored = [x.split("->") for x in _lines(_contract()["ignore_imports"])]
    assert {t.strip() for _, t in ignored} == INTERFACE
    assert {s.strip() for s, _ in ignored} == {"autotune.runtime.**", "autotune.engine.**"}


def test_every_family_module_is_outside_the_interface():
    from autotune.tactics import registry
    for name, path in registry.FAMILIES.items():
        module = path.partition(":")[0]
        assert not any(module == m or module.startswith(m + ".") for m in INTERFACE), (name, module)
        assert module.startswith("autotune.tactics."), (name, module)

"""One settings module reads every AUTOTUNE_* environment variable."""
import ast
from pathlib import Path

import pytest

from autotune.core import settings

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ["autotune", "cache", "tactics", "tools", "cli.py"]


def _env_names(path: Path) -> list[str]:
    """String constants that are an AUTOTUNE_* variable name (docstrings and help texts mention
    them inside longer text, which is not a read)."""
    tree = ast.parse(path.read_text())
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("AUTOTUNE_")
            and n.value.replace("_", "").isalnum() and n.value.isupper()]


def test_only_the_settings_module_names_autotune_variables():
    files = [p for top in LIBRARY for p in ((ROOT / top).rglob("*.py") if (ROOT / top).is_dir() else [ROOT / top])]
    found = {str(p.relative_to(ROOT)): names for p in files if (names := _env_names(p))}
    assert set(found) == {"autotune/core/settings.py"}, found
    assert sorted(found["autotune/core/settings.py"]) == sorted(
        [settings.CACHE, settings.MISSES, settings.PIN, settings.CACHE_IMMUTABLE, settings.SIGNING_KEY,
         settings.SIGNING_KEY_FILE, settings.CLAIM_TTL_S, settings.LAUNCH, settings.CUDA_CUBINS,
         settings.BATCH_INVARIANT, settings.ACTIVATIONS, settings.CHECK_IDS, settings.PDL, settings.PREFETCH_W2])


@pytest.mark.parametrize("value, want", [("", None), ("  ", None), (" /x/c.db ", "/x/c.db")])
def test_cache_url_is_read_at_call_time(monkeypatch, value, want):
    monkeypatch.setenv("AUTOTUNE_CACHE", value)
    assert settings.cache_url() == want


def test_launch_route(monkeypatch):
    for v, want in (("", "direct"), ("direct", "direct"), ("triton", "triton"), (" Triton ", "triton"), ("x", "direct")):
        monkeypatch.setenv("AUTOTUNE_LAUNCH", v)
        assert settings.launch_route() == want


def test_immutable_and_pins_and_misses(monkeypatch):
    for v, want in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv("AUTOTUNE_CACHE_IMMUTABLE", v)
        assert settings.cache_immutable() is want
    monkeypatch.delenv("AUTOTUNE_PIN", raising=False)
    monkeypatch.delenv("AUTOTUNE_MISSES", raising=False)
    assert settings.pins() == "" and settings.misses_url() is None
    monkeypatch.setenv("AUTOTUNE_MISSES", "/m.db")
    assert settings.misses_url() == "/m.db"


def test_batch_invariant_switch(monkeypatch):
    monkeypatch.delenv("AUTOTUNE_BATCH_INVARIANT", raising=False)
    for v, want in (("", False), ("0", False), ("1", True), ("2", True), ("x", False)):
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", v)               # vLLM's own switch, read as vLLM does
        assert settings.batch_invariant() is want, v
    for v, want in (("1", True), ("true", True), ("0", False), (" FALSE ", False)):
        monkeypatch.setenv("AUTOTUNE_BATCH_INVARIANT", v)           # ours wins either way
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0" if want else "1")
        assert settings.batch_invariant() is want, v
    monkeypatch.setenv("AUTOTUNE_BATCH_INVARIANT", "yes")
    with pytest.raises(ValueError, match="AUTOTUNE_BATCH_INVARIANT must be 1, true, 0 or false"):
        settings.batch_invariant()

import os

import pytest


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _cc():
    import torch
    return torch.cuda.get_device_capability() if _cuda() else None


def pytest_collection_modifyitems(config, items):
    cc = _cc()
    need = {"gpu": cc is not None, "requires_sm90": cc == (9, 0),
            "requires_sm100": cc is not None and cc[0] == 10,
            "requires_sm120": cc is not None and cc[0] == 12}
    for item in items:
        for mark, ok in need.items():
            if mark in item.keywords and not ok:
                item.add_marker(pytest.mark.skip(reason=f"{mark}: no such GPU here"))


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A fresh cache path, also exported as AUTOTUNE_CACHE for code that reads the default."""
    path = tmp_path / "cache.db"
    monkeypatch.setenv("AUTOTUNE_CACHE", str(path))
    return path


@pytest.fixture
def register_family(monkeypatch):
    """register_family(name, "module:Class") -> the family object; undone after the test."""
    from autotune.tactics import registry

    def register(name: str, path: str):
        monkeypatch.setitem(registry.FAMILIES, name, path)
        registry.get.cache_clear()
        return registry.get(name)
    yield register
    registry.get.cache_clear()


@pytest.fixture
def swizzle_calls(monkeypatch):
    """Counts every call of the 128x4 swizzle (by the shape it was given); the real function runs."""
    from autotune.core import formats
    calls, real = [], formats.swizzle_128x4

    def counted(scales):
        calls.append(tuple(scales.shape))
        return real(scales)
    monkeypatch.setattr(formats, "swizzle_128x4", counted)
    return calls

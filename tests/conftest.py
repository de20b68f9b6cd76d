import os
from pathlib import Path

import pytest


# ----------------------------------------------------------------- no test touches the real cache
#: the user's real cache locations, as this run found them (before any test redirected them)
def _real_cache_paths() -> list[Path]:
    import platformdirs
    paths = [Path(platformdirs.user_cache_dir("fp4-autotune"))]
    env = os.environ.get("AUTOTUNE_CACHE", "").strip()
    if env and "://" not in env:
        f = Path(env).expanduser()
        paths += [f, f.with_name(f.name + "-wal"), f.with_name(f.name + "-shm"), f.with_name(f.name + "-journal")]
    return paths


def _state(p: Path):
    """What is at `p` (None: nothing): a file's size and mtime, a directory's files' sizes and mtimes."""
    try:
        if p.is_dir():
            return sorted((str(f.relative_to(p)), f.stat().st_size, f.stat().st_mtime_ns)
                          for f in p.rglob("*") if f.is_file())
        st = p.stat()
        return (st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        return None


_REAL = {p: _state(p) for p in _real_cache_paths()}


@pytest.fixture(scope="session")
def _user_cache_home(tmp_path_factory):
    return tmp_path_factory.mktemp("user-cache-home")


@pytest.fixture(autouse=True)
def _no_real_cache(monkeypatch, tmp_path_factory, _user_cache_home):
    """Every test (and every process it starts) sees a cache of its own: AUTOTUNE_CACHE is a file in
    a fresh temporary directory, and the user cache directory (platformdirs: XDG_CACHE_HOME, where
    the default cache and the cuda family's cubins live) is one temporary directory per run."""
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path_factory.mktemp("default-cache") / "cache.db"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(_user_cache_home))


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a test created, changed or removed the user's real cache."""
    touched = [str(p) for p, before in _REAL.items() if _state(p) != before]
    if touched:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_sep("!", "a test touched the real cache: " + ", ".join(touched), red=True)
        session.exitstatus = 1


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


@pytest.fixture
def event_deadlines(monkeypatch, tmp_path_factory):
    """Requests to isolated processes (a compile worker's precompile, a measuring worker's check
    or timing) time out on an event, not on the clock: only the request of a tactic whose process
    said it hangs (tests.families.say_hanging) expires, whatever --timeout-s and however slow the
    machine. Returns the directory the hanging members mark themselves in."""
    from autotune.core.tactic import Tactic
    from autotune.engine import deadline
    from tests.families import HANGING
    marks = tmp_path_factory.mktemp("hanging")
    monkeypatch.setenv(HANGING, str(marks))

    class OnEvent:
        def __init__(self, timeout_s, tactic_json=None):
            try:
                self.mark = marks / Tactic.from_json(tactic_json).id if tactic_json else None
            except (ValueError, TypeError):
                self.mark = None

        def expired(self) -> bool:
            return self.mark is not None and self.mark.exists()

        def remaining(self) -> float:
            return 0.0 if self.expired() else 0.05      # how often the waiting side looks again

    monkeypatch.setattr(deadline, "make", OnEvent)
    return marks

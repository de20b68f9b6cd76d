"""Where a cache lives: URLs and paths, and the checks made on a SQLite file before SQLAlchemy
opens it (magic, truncation, writability). No ORM here; imports nothing of the project."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import unquote

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from autotune.core import settings

SQLITE_MAGIC = b"SQLite format 3\x00"


class CacheError(Exception):
    """Any cache failure, with a one-line message fit for the user."""


def one_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e) or type(e).__name__
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


# ---------------------------------------------------------------------------------------- URLs

def path_url(p: str | os.PathLike) -> str:
    return "sqlite:///" + os.path.abspath(os.path.expanduser(os.fspath(p)))


def default_url() -> str:
    """$AUTOTUNE_CACHE (a file path or any SQLAlchemy URL), else the per-user cache file."""
    env = settings.cache_url()
    if env:
        return env if "://" in env else path_url(env)
    import platformdirs
    return path_url(Path(platformdirs.user_cache_dir("fp4-autotune")) / "cache.db")


def to_url(url: str | os.PathLike | None) -> str:
    if url is None:
        return default_url()
    if isinstance(url, os.PathLike):
        return path_url(url)
    s = str(url).strip()
    if not s:
        raise CacheError("empty cache location")
    return s if "://" in s else path_url(s)


def parse(url: str) -> URL:
    try:
        u = make_url(url)
    except ArgumentError as e:
        raise CacheError(f"not a database URL or path: {url!r} ({one_line(e)})") from None
    if u.query and is_sqlite(u) and sqlite_file(u) is not None:
        # a read-only open (show, serving) reopens the file its own way, and `uri=true` on a plain
        # path makes SQLite create a file named `new.db?mode=rwc`: no parameter is honoured alike
        raise CacheError(f"{url}: SQLite URL parameters ({', '.join(sorted(u.query))}) are not supported (search, "
                         f"show and serving open the cache file alike without them); give the file's path")
    return u


def is_sqlite(u: URL) -> bool:
    return u.get_backend_name() == "sqlite"


def sqlite_file(u: URL) -> Path | None:
    """The file behind a SQLite URL, None for an in-memory database."""
    db = u.database or ""
    if not db or db == ":memory:" or u.query.get("mode") == "memory":
        return None
    if db.startswith("file:"):
        db = unquote(db[5:].split("?", 1)[0])
    return Path(os.path.abspath(os.path.expanduser(db)))


def check_header(path: Path) -> None:
    """Refuse a file that is not SQLite, or a SQLite file shorter than its header says."""
    try:
        size = path.stat().st_size
        if size == 0:
            return
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise CacheError(f"cannot read cache {path}: {e.strerror or e}") from None
    if len(head) < 100 or not head.startswith(SQLITE_MAGIC):
        raise CacheError(f"{path} is not an fp4-autotune cache: not a SQLite database")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    valid = head[24:28] == head[92:96]
    # with a -wal file present a writer may be mid-checkpoint: the header can run ahead of the file
    if valid and pages and not Path(str(path) + "-wal").exists() and size < pages * page:
        raise CacheError(f"{path} is not an fp4-autotune cache: truncated ({size} of {pages * page} bytes)")


def immutable_ok(p: Path) -> bool:
    """Can a read-only open skip SQLite's locking? Yes when nothing can be writing the file: no
    -wal beside it and either its directory is not writable (a WAL reader could not create -shm)
    or it is in rollback-journal mode (every Store writer switches a file to WAL first, and
    exports are written in rollback mode)."""
    if Path(str(p) + "-wal").exists():
        return False
    if not os.access(p.parent, os.W_OK):
        return True
    try:
        with open(p, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[18] == 1 and head[19] == 1


def probe_dir(d: Path, target: Path) -> None:
    """Can files be created in d? Creates and removes one temp file (nothing is left behind)."""
    if not os.access(d, os.W_OK | os.X_OK):
        raise CacheError(f"cannot write cache {target}: no write permission on {d}")
    try:
        fd, name = tempfile.mkstemp(prefix=".fp4-autotune-probe-", dir=d)
    except OSError as e:
        raise CacheError(f"cannot write cache {target}: cannot create files in {d} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(name)


def is_locked(e: OperationalError) -> bool:
    msg = one_line(e).lower()
    return "locked" in msg or "busy" in msg

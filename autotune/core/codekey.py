"""Code keys: which code measured a trial or winner.

A family's library key (env.lib_key) says which library versions ran; it cannot see an edit to
our own kernel, launch or pack code. Each member (one kernel with its launch and pack code)
declares its sources as a `Code`: the project modules its measured numbers depend on and the data
files it compiles (a .cu text). `code_key(lib_key, code)` joins a digest of those sources with the
library key; every trial and winner stores it, and a stored row whose key differs from the live one
is neither served nor counted as measured.

The digest reads the files (never imports them: a Triton kernel module imports Triton). Python is
tokenized and comments, blank lines and bare string statements (docstrings) dropped, so editing
prose keeps the key and editing code changes it. It is computed once per process per Code.
tests/test_code_keys.py walks each member's imports and fails on a project module the member
imports but does not declare.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from autotune.core.tactic import canonical_json

#: the digest format: bump when _python_tokens changes, so no key of the old form ever matches
_FORM = 1


@dataclass(frozen=True)
class Code:
    """A member's declared sources. `modules`: absolute module names (kernel, launch and pack
    code, their project helpers); `files`: (package module, file name) of data files the member
    compiles. Build options live in those sources (the macros and flags they pass)."""

    member: str
    modules: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, member: str, package: str, *modules: str, files: tuple[tuple[str, str], ...] = ()) -> "Code":
        """Code with `modules` given absolutely or relative to `package` (".kernel", "..base"), so a
        declaration survives a move of its package."""
        names = tuple(sorted({importlib.util.resolve_name(m, package) for m in modules}))
        fs = tuple(sorted((importlib.util.resolve_name(p, package), f) for p, f in files))
        return cls(member, names, fs)

    def __add__(self, other: "Code") -> "Code":
        """Both declarations under this one's member name (shared helpers + one kernel)."""
        return Code(self.member, tuple(sorted(set(self.modules) | set(other.modules))),
                    tuple(sorted(set(self.files) | set(other.files))))


def _package_dir(top: str, root: Path | None) -> Path:
    if root is not None:
        return root / top
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"code key: no package {top!r}")
    return Path(list(spec.submodule_search_locations)[0])


def module_file(name: str, root: Path | None = None) -> Path:
    """The source file of module `name` (under `root` instead of where it is installed, for tests
    that key a modified copy). Never imports it."""
    top, _, rest = name.partition(".")
    base = _package_dir(top, root)
    parts = rest.split(".") if rest else []
    f = base.joinpath(*parts).with_suffix(".py") if parts else base / "__init__.py"
    if not f.is_file():
        f = base.joinpath(*parts, "__init__.py")
    if not f.is_file():
        raise ValueError(f"code key: no source file for module {name!r} (looked under {base})")
    return f


def data_file(package: str, name: str, root: Path | None = None) -> Path:
    top, _, rest = package.partition(".")
    f = _package_dir(top, root).joinpath(*(rest.split(".") if rest else []), name)
    if not f.is_file():
        raise ValueError(f"code key: no file {name!r} beside package {package!r}")
    return f


def _python_tokens(text: str) -> str:
    """The code of a Python source, without comments, blank lines and bare string statements."""
    out: list[str] = []
    line: list[tuple[int, str]] = []
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in skip:
            continue
        if tok.type in (tokenize.INDENT, tokenize.DEDENT):
            out.append(tokenize.tok_name[tok.type])
            continue
        if tok.type != tokenize.NEWLINE:
            line.append((tok.type, tok.string))
            continue
        if not all(t == tokenize.STRING for t, _ in line):       # a docstring or bare string: no code
            out.append(" ".join(s for _, s in line))
        line = []
    if line and not all(t == tokenize.STRING for t, _ in line):
        out.append(" ".join(s for _, s in line))
    return "\n".join(out)


def _digest(code: Code, root: Path | None) -> str:
    h = hashlib.sha256(f"code-key-form {_FORM}\n".encode())
    for name in code.modules:
        h.update(f"\0module {name}\n".encode())
        h.update(_python_tokens(module_file(name, root).read_text(encoding="utf-8")).encode())
    for pkg, fname in code.files:
        h.update(f"\0file {pkg}:{fname}\n".encode())
        h.update(data_file(pkg, fname, root).read_bytes())
    return h.hexdigest()[:16]


@lru_cache(maxsize=None)
def _digest_cached(code: Code) -> str:
    return _digest(code, None)


def digest(code: Code, root: Path | None = None) -> str:
    """The 16-hex digest of the declared sources as installed (cached per process), or as found
    under `root`."""
    return _digest_cached(code) if root is None else _digest(code, root)


@lru_cache(maxsize=4096)
def code_key(lib_key: str, code: Code) -> str:
    """The key stored with every trial and winner: the library key joined with the sources'."""
    return hashlib.sha256(canonical_json({"lib": lib_key, "code": digest(code)}).encode()).hexdigest()[:16]


def code_key_at(lib_key: str, code: Code, root: Path) -> str:
    """code_key over the sources under `root` (a modified copy, for tests)."""
    return hashlib.sha256(canonical_json({"lib": lib_key, "code": digest(code, root)}).encode()).hexdigest()[:16]

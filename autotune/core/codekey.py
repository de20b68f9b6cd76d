"""Code keys: which code measured a trial or winner.

A family's library key (env.lib_key) says which library versions ran; it cannot see an edit to
our own kernel, launch or pack code. Each member (one kernel with its launch and pack code)
declares its sources as a `Code`: the project modules its measured numbers depend on and the data
files it compiles (a .cu text). `code_key(lib_key, code)` joins a digest of those sources with the
library key; every trial and winner stores it, and a stored row whose key differs from the live one
is neither served nor counted as measured.

The key also covers how the search draws what it times (measure.py: a grouped problem's routing), so
a time drawn one way is never served under a draw of another; the digest alone (the GPU-check
record's) does not.

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

from autotune.core import measure
from autotune.core.tactic import canonical_json

#: modules whose effect every key carries by value (measure.form()), so no member declares them
BY_VALUE = ("autotune.core.measure",)

#: the digest format: bump when _python_tokens changes, so no key of the old form ever matches
#: (2: f-strings folded to one token, so 3.11 and 3.12 give one digest)
_FORM = 2


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


def _top_module(top: str, root: Path | None) -> Path | None:
    """The file of a top-level module that is not a package (`mymod.py`, as a third-party family
    installed through the entry point may be), or None."""
    if root is not None:
        f = root / f"{top}.py"
        return f if f.is_file() and not (root / top).is_dir() else None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations or not spec.origin or not spec.has_location:
        return None
    f = Path(spec.origin)
    return f if f.suffix == ".py" and f.is_file() else None


def _package_dir(top: str, root: Path | None) -> Path:
    if root is not None:
        if _top_module(top, root) is not None:
            return root         # data files of a top-level module lie beside it
        return root / top
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ValueError(f"code key: no module {top!r}")
    if not spec.submodule_search_locations:
        mod = _top_module(top, None)
        if mod is None:
            raise ValueError(f"code key: {top!r} is neither a package nor a Python source module")
        return mod.parent
    return Path(list(spec.submodule_search_locations)[0])


def module_file(name: str, root: Path | None = None) -> Path:
    """The source file of module `name` (under `root` instead of where it is installed, for tests
    that key a modified copy): a package's module, or a top-level module keyed like a package's.
    Never imports it."""
    top, _, rest = name.partition(".")
    if not rest:
        mod = _top_module(top, root)
        if mod is not None:
            return mod
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


#: token types that open and close a string with fields (3.12's f-strings, 3.14's t-strings); absent
#: before 3.12, where the tokenizer gives the whole literal as one STRING token
_OPEN = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, n)}
_CLOSE = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)}


def _tokens(text: str):
    """(type, string) of each token, with every f-string folded back into one STRING token of its
    source text, as Python 3.11 and earlier tokenize it: the digest must not depend on which Python
    computes it (the device's 3.12 records GPU checks that CI's 3.11 reads)."""
    lines = text.splitlines(keepends=True)
    depth, start = 0, (0, 0)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in _OPEN:
            if depth == 0:
                start = tok.start
            depth += 1
        elif depth:
            if tok.type in _CLOSE:
                depth -= 1
                if depth == 0:
                    yield tokenize.STRING, _span(lines, start, tok.end)
        else:
            yield tok.type, tok.string


def _span(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The source text between two tokenize positions (1-based rows, 0-based columns)."""
    (r0, c0), (r1, c1) = start, end
    if r0 == r1:
        return lines[r0 - 1][c0:c1]
    return lines[r0 - 1][c0:] + "".join(lines[r0:r1 - 1]) + lines[r1 - 1][:c1]


def _python_tokens(text: str) -> str:
    """The code of a Python source, without comments, blank lines and bare string statements."""
    out: list[str] = []
    line: list[tuple[int, str]] = []
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    for typ, string in _tokens(text):
        if typ in skip:
            continue
        if typ in (tokenize.INDENT, tokenize.DEDENT):
            out.append(tokenize.tok_name[typ])
            continue
        if typ != tokenize.NEWLINE:
            line.append((typ, string))
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
    return _join(lib_key, digest(code))


def _join(lib_key: str, code_digest: str) -> str:
    # the search's draw joins here, not in the digest: a GPU check (checked.py) is of the code alone
    return hashlib.sha256(canonical_json({"lib": lib_key, "code": code_digest, "measure": measure.form()})
                          .encode()).hexdigest()[:16]


def code_key_at(lib_key: str, code: Code, root: Path) -> str:
    """code_key over the sources under `root` (a modified copy, for tests)."""
    return _join(lib_key, digest(code, root))

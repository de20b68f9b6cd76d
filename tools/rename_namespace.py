"""Move a tree onto the namespaced import names: `tactics` -> `autotune.tactics`, `cache` ->
`autotune.cache`, `cli` -> `autotune.cli` (issue #23 item 1).

    python3 tools/rename_namespace.py [ROOT] [--check]

Rewrites, over *.py, *.sh, *.md, *.cfg, *.toml and .importlinter under ROOT (default: the
current directory):
  * import statements: `from tactics.x import y`, `import cache`, `from cli import main`,
    also inside `python -c "..."` strings and heredocs;
  * `-m cli` (shell and argument lists) and `cli:main` entry points;
  * dotted module paths in strings, comments and prose (`"tactics.torch_ref:TorchFamily"`,
    `monkeypatch.setattr("cache.store.X", ...)`, "checked by cache.rows"): only where the name
    after the dot is a module of that package in this tree, or a public name of its __init__
    (so `cache.db`, `tactics.get(...)` and a variable `cache` are left alone; Python code outside
    strings and comments is never touched except for import statements);
  * setup.cfg's package list and .importlinter's module lists;
and creates the links autotune/tactics -> ../tactics, autotune/cache -> ../cache,
autotune/cli.py -> ../cli.py that make the names resolve in a checkout (docs/architecture.md).

Idempotent: every pattern requires the old top-level name not already behind `autotune.`, so a
second run changes nothing (`--check` exits 1 when something would still change).
"""
from __future__ import annotations

import ast
import io
import os
import re
import sys
import tokenize
from pathlib import Path

PACKAGES = ("tactics", "cache")
TOPS = (*PACKAGES, "cli")
SUFFIXES = (".py", ".sh", ".md", ".cfg", ".toml")
SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".venv", "venv", "node_modules", ".mypy_cache",
             ".pytest_cache", ".ruff_cache",
             ".flashinfer", ".whl", ".gl", ".benchmarks"}    # installed or downloaded, git-ignored: not this tree's code
LINKS = {"autotune/tactics": "../tactics", "autotune/cache": "../cache", "autotune/cli.py": "../cli.py"}
SELF = Path(__file__).resolve()
KEEP = {Path("tools/rename_namespace.py"), Path("tests/test_rename.py")}     # they spell the old names

_TOP = "|".join(TOPS)
# an import statement at a line start, after ';' or after an opening quote (python -c "...")
_LEAD = r"(?P<lead>(?:^|(?<=[;\"'(`]))[ \t]*)"
FROM_RE = re.compile(_LEAD + rf"from[ \t]+(?P<top>{_TOP})(?P<rest>(?:\.\w+)*)[ \t]+import\b", re.M)
IMPORT_RE = re.compile(_LEAD + rf"import[ \t]+(?P<top>{_TOP})(?P<rest>(?:\.\w+)*)"
                       r"(?P<alias>[ \t]+as[ \t]+\w+)?(?=[ \t]*(?:$|[;#\"')]))", re.M)
DASH_M_RE = re.compile(r"(?P<pre>-m[ \t]+|[\"']-m[\"'],[ \t]*[\"'])(?P<top>cli(?![\w.])|(?:tactics|cache)(?=\.\w))")
ENTRY_RE = re.compile(r"(?<![\w./-])cli:(?=[A-Za-z_])")
DOTTED_RE = re.compile(rf"(?<![\w./-])(?P<top>{'|'.join(PACKAGES)})\.(?P<name>[A-Za-z_]\w*)")


class Tree:
    """What the packages of this tree hold: their modules and their __init__'s public names."""

    def __init__(self, root: Path):
        self.root = root
        self.modules = {top: self._modules(root / top) for top in PACKAGES}
        self.names = {top: self.modules[top] | self._public(root / top) for top in PACKAGES}

    @staticmethod
    def _modules(pkg: Path) -> set[str]:
        if not pkg.is_dir():
            return set()
        return ({p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
                | {p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()})

    @staticmethod
    def _public(pkg: Path) -> set[str]:
        names: set[str] = set()
        init = pkg / "__init__.py"
        if init.exists():
            for node in ast.parse(init.read_text()).body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in node.names}
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Assign):
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return names

    def dotted(self, text: str, public: bool = True) -> str:
        """`public=False`: modules only (a string may be code: `cache.Store(...)` after
        `from autotune import cache` must stay)."""
        def sub(m: re.Match) -> str:
            names = self.names[m["top"]] if public else self.modules[m["top"]]
            return f"autotune.{m[0]}" if m["name"] in names else m[0]
        return DOTTED_RE.sub(sub, text)


def _from(m: re.Match) -> str:
    return f"{m['lead']}from autotune.{m['top']}{m['rest']} import"


def _import(m: re.Match) -> str:
    alias = m["alias"] or ""
    if not m["rest"]:                                   # `import cache [as c]`: the same name bound
        return f"{m['lead']}from autotune import {m['top']}{alias}"
    if not alias:                                       # binds `autotune`: uses of `tactics.x` must follow
        print(f"  note: `import {m['top']}{m['rest']}` became `import autotune.{m['top']}{m['rest']}`;"
              f" references to `{m['top']}.` need the `autotune.` prefix", file=sys.stderr)
    return f"{m['lead']}import autotune.{m['top']}{m['rest']}{alias}"


def statements(text: str) -> str:
    """Import statements, `-m` module names and `cli:` entry points (every file type)."""
    text = FROM_RE.sub(_from, text)
    text = IMPORT_RE.sub(_import, text)
    text = DASH_M_RE.sub(lambda m: f"{m['pre']}autotune.{m['top']}", text)
    return ENTRY_RE.sub("autotune.cli:", text)


def python(text: str, tree: Tree) -> str:
    """Import statements anywhere; dotted paths only inside strings and comments."""
    text = statements(text)
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return text                                      # not Python we can read: statements only
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    out, pos = [], 0
    for tok in toks:
        if tok.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        a = starts[tok.start[0] - 1] + tok.start[1]
        b = starts[tok.end[0] - 1] + tok.end[1]
        out += [text[pos:a], tree.dotted(text[a:b], public=tok.type == tokenize.COMMENT)]
        pos = b
    out.append(text[pos:])
    return "".join(out)


def setup_cfg(text: str, tree: Tree) -> str:
    text = tree.dotted(statements(text))
    text = re.sub(r"^py_modules[ \t]*=[ \t]*cli[ \t]*\n", "", text, flags=re.M)
    # the packages under the namespace are found as autotune.* (through the links)
    return re.sub(r"^[ \t]+(?:tactics|cache)(?:\.\*)?[ \t]*\n", "", text, flags=re.M)


def importlinter(text: str) -> str:
    def line(m: re.Match) -> str:
        return re.sub(r"(?<![\w.])(tactics|cache)(?![\w])", r"autotune.\1", m[0])
    text = re.sub(r"^[ \t]+[\w.*| \t]+$", line, text, flags=re.M)
    # autotune.tactics and autotune.cache are inside the root package autotune
    block = re.search(r"^root_packages[ \t]*=[ \t]*\n((?:[ \t]+\S.*\n)*)", text, flags=re.M)
    if block:
        kept = "".join(ln for ln in block[1].splitlines(keepends=True)
                       if ln.strip() not in ("autotune.tactics", "autotune.cache"))
        text = text[:block.start(1)] + kept + text[block.end(1):]
    return text


def rewrite(path: Path, text: str, tree: Tree) -> str:
    if path.name == ".importlinter":
        return importlinter(text)
    if path.name == "setup.cfg":
        return setup_cfg(text, tree)
    if path.suffix == ".py":
        return python(text, tree)
    return tree.dotted(statements(text))


def files(root: Path):
    for d, dirs, names in os.walk(root):           # links are not followed: each file once
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info"))
        for n in sorted(names):
            p = Path(d) / n
            if ((p.suffix in SUFFIXES or n == ".importlinter") and not p.is_symlink()
                    and p.resolve() != SELF and p.relative_to(root) not in KEEP):
                yield p


def link(root: Path, check: bool) -> list[str]:
    made = []
    for where, target in LINKS.items():
        p = root / where
        if p.is_symlink() or not (root / where).parent.is_dir() or not (p.parent / target).exists():
            continue
        if p.exists():
            raise SystemExit(f"{p} exists and is not a link to {target}: move it first")
        made.append(where)
        if not check:
            p.symlink_to(target)
    return made


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    root = Path(args[0] if args else ".").resolve()
    if not (root / "autotune").is_dir():
        raise SystemExit(f"{root}: no autotune/ here; give the repository root")
    tree = Tree(root)
    changed = []
    for p in files(root):
        old = p.read_text(errors="surrogateescape")
        new = rewrite(p, old, tree)
        if new != old:
            changed.append(str(p.relative_to(root)))
            if not check:
                p.write_text(new, errors="surrogateescape")
    changed += link(root, check)
    for c in changed:
        print(("would change " if check else "changed ") + c)
    print(f"{len(changed)} file(s) {'to change' if check else 'changed'}", file=sys.stderr)
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

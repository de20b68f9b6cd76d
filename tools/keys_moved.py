"""What a change moved, before a GPU call: every family member's code key and every cuda GPU-check
digest that differs between git rev BASE (the last main job's commit) and the working tree.

    python tools/keys_moved.py BASE [--repo DIR] [--json]

A moved code key means that member's stored trials and winners go stale (autotune.core.codekey: the
search measures them again); a moved GPU-check digest means that cuda kernel is `unknown` until its
GPU tests pass on hardware and tools/mark_gpu_checked.py records it (tactics/cuda/checked.py).

Each side is read by a fresh interpreter with that tree first on PYTHONPATH (BASE exported with
`git archive` into a temporary directory), so the keys are the ones that tree's own code computes.
Keys are shown under this machine's library versions; the GPU machine's differ, but a key moves
there exactly when it moves here (the same libraries on both sides). Exit status 0 with or without
moves; 2 when BASE is not a commit or a side cannot be read.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

#: run inside each tree: prints {"members": {member: {"family", "digest", "key"}}, "gpu": {kernel:
#: {"digest", "recorded"}}, "errors": [...]}; only long-lived names (registry, Family.codes,
#: codekey, cuda checked/build) so an older tree answers too
_PROBE = r'''
import json, sys
out = {"members": {}, "gpu": {}, "errors": []}
from autotune.core import codekey, env
from autotune.tactics import registry
live = env.cpu()
for name in registry.names():
    try:
        fam = registry.get(name)
        lib = live.lib_key(tuple(fam.depends_on))
        for code in fam.codes():
            out["members"][code.member] = {"family": name, "digest": codekey.digest(code),
                                           "key": codekey.code_key(lib, code)}
    except Exception as e:  # noqa: BLE001 - reported, the rest still compared
        out["errors"].append(f"family {name}: {type(e).__name__}: {e}")
try:
    from autotune.tactics.cuda import build as B, checked as CK
    rec = CK.record()
    for k in B.SOURCES:
        out["gpu"][k] = {"digest": CK.digest(k), "recorded": (rec.get(k) or {}).get("digest")}
except Exception as e:  # noqa: BLE001
    out["errors"].append(f"cuda GPU-check digests: {type(e).__name__}: {e}")
json.dump(out, sys.stdout)
'''


class Failed(Exception):
    """A one-line reason the comparison cannot be made."""


def _git(repo: Path, *args: str, binary: bool = False):
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=not binary)
    if r.returncode:
        err = r.stderr if not binary else r.stderr.decode(errors="replace")
        raise Failed(f"git {' '.join(args)}: {err.strip().splitlines()[-1] if err.strip() else 'failed'}")
    return r.stdout


def export(repo: Path, rev: str, dest: Path) -> str:
    """Write rev's tree under `dest` (git archive); return its full commit hash."""
    commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    if not commit:
        raise Failed(f"{rev!r} is not a commit in {repo}")
    tar = dest / "tree.tar"
    tar.write_bytes(_git(repo, "archive", "--format=tar", commit, binary=True))
    root = dest / "tree"
    root.mkdir()
    with tarfile.open(tar) as t:
        t.extractall(root, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
    tar.unlink()
    return commit


def probe(root: Path) -> dict:
    """The keys and digests `root`'s own code computes (a fresh interpreter, `root` first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([sys.executable, "-c", _PROBE], cwd=root, env=env, capture_output=True, text=True)
    if r.returncode:
        tail = r.stderr.strip().splitlines()
        raise Failed(f"reading {root}: {tail[-1] if tail else f'exit {r.returncode}'}")
    return json.loads(r.stdout)


def moved(base: dict, tree: dict) -> dict:
    """{"members": [(member, family, base digest|None, tree digest|None)], "gpu": [(kernel, base, tree,
    recorded in the tree)], "errors": [...]}: only what differs (a member on one side only included)."""
    mb, mt = base["members"], tree["members"]
    members = [(m, (mt.get(m) or mb[m])["family"], (mb.get(m) or {}).get("digest"), (mt.get(m) or {}).get("digest"))
               for m in sorted(set(mb) | set(mt)) if (mb.get(m) or {}).get("key") != (mt.get(m) or {}).get("key")]
    gb, gt = base["gpu"], tree["gpu"]
    gpu = [(k, (gb.get(k) or {}).get("digest"), (gt.get(k) or {}).get("digest"), (gt.get(k) or {}).get("recorded"))
           for k in sorted(set(gb) | set(gt)) if (gb.get(k) or {}).get("digest") != (gt.get(k) or {}).get("digest")]
    errors = [f"BASE: {e}" for e in base["errors"]] + [f"tree: {e}" for e in tree["errors"]]
    return {"members": members, "gpu": gpu, "errors": errors, "of": len(set(mb) | set(mt))}


def render(rev: str, commit: str, diff: dict) -> str:
    lines = [f"code keys moved between {rev} ({commit[:12]}) and the working tree: "
             f"{len(diff['members'])} of {diff['of']} members"]
    for m, fam, a, b in diff["members"]:
        lines.append(f"  {m:<34} {fam:<10} {a or '(none)':>16} -> {b or '(none)'}")
    lines.append(f"cuda GPU-check digests moved: {len(diff['gpu'])}")
    for k, a, b, rec in diff["gpu"]:
        state = "recorded" if rec is not None and rec == b else "needs its GPU tests and a new record"
        lines.append(f"  {k:<34} {a or '(none)':>16} -> {b or '(none)'}  ({state})")
    lines += [f"not compared: {e}" for e in diff["errors"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="git rev of the last main job's commit")
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the working tree to compare (default: this checkout)")
    ap.add_argument("--json", action="store_true", help="print the moves as JSON")
    a = ap.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="keys-moved-") as tmp:
            commit = export(a.repo, a.base, Path(tmp))
            diff = moved(probe(Path(tmp) / "tree"), probe(a.repo.resolve()))
    except Failed as e:
        print(f"keys_moved: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"base": commit, **diff}, indent=1) if a.json else render(a.base, commit, diff))
    return 0


if __name__ == "__main__":
    sys.exit(main())

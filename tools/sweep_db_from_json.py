"""Rebuild the moe_mma config sweep's cache (a rank-model source) from the run's committed JSON (no GPU).

    python3 tools/sweep_db_from_json.py --force    # writes docs/data/2026-12-03-h200-moe-config-sweep.db.xz
    python3 tools/sweep_db_from_json.py --json RUN/moe_latency.json --out X.db --code-rev REV --force

The 2026-12-03 H200 run of bench/moe_latency_h200.py (at commit f4cc350) committed its JSON
(docs/data/2026-12-03-h200-moe-config-sweep.json, every sweep row with its time) but not the SQLite
cache its `--store` wrote, which tools/fit_rank_models.py reads. This writes that cache again with
that script's `store_sweep` (kept here: the same trials: status
ok, median_us the row's `us`, the verdict's smem, keyed by device, libraries and code), with two
inputs the GPU run took from the live machine taken from committed files instead:

* the environment: the device record of the same H200 with the same libraries in another committed
  cache of that machine (--env-cache, default docs/data/2026-12-02-h200-main-job.db.xz), rebuilt
  as an `Env` and checked against its stored device key and the JSON's GPU and torch version;
* the code keys: of the revision that measured (--code-rev, default the commit that committed the
  JSON), computed over that revision's sources (`git archive` of autotune/ and tactics/ into a
  temporary folder, autotune.core.codekey.code_key_at), not over the code installed here, which may
  have changed since (a stored trial of other code is stale: neither served nor counted).

The file is written in a temporary folder, made self-contained (rollback journal, no -wal/-shm) and
copied to --out (xz-compressed when --out ends in .xz); its trial count is checked against the JSON's `stored_trials`.
"""
from __future__ import annotations

import argparse
import lzma
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.cache.store import Store  # noqa: E402
from autotune.core.arch import arch_for_cc  # noqa: E402
from autotune.core.env import KNOWN_LIBS, Env  # noqa: E402
from autotune.core.problem import Problem  # noqa: E402
from autotune.core.tactic import canonical_json  # noqa: E402
from autotune.tactics import registry  # noqa: E402
from tools.fit_rank_models import copy  # noqa: E402  (a committed cache decompressed, never opened in place)

JSON = "docs/data/2026-12-03-h200-moe-config-sweep.json"
OUT = "docs/data/2026-12-03-h200-moe-config-sweep.db.xz"
ENV_CACHE = "docs/data/2026-12-02-h200-main-job.db.xz"


#: the sweep's two problems: GLM-5 TP8's routed experts (E 256, top 8, hidden 6144, intermediate 256)
W13 = Problem.moe(2 * 256, 6144, 256, 8, epilogue="swiglu")
W2 = Problem.moe(6144, 256, 256, 8, epilogue="reduce")


def store_sweep(path: Path, rows: list, fam, arch, env: Env, code_root: Path | None = None, code=None) -> int:
    """The sweep's timings as trials of a cache at `path` (status ok, keyed by device, libraries and
    code like the engine's). code_root: a checkout of the revision that measured (None: the code
    installed here), its code keys taken from there, with `code` (that revision's own declaration of
    moe_mma's sources; None: this install's)."""
    from autotune.core.codekey import code_key_at
    from autotune.core.records import Trial
    from autotune.core.tactic import Tactic
    from autotune.tactics.cuda import moe as MOE
    lib = env.lib_key(fam.depends_on)
    probs = {p.key: p for p in (W13, W2)}
    trials = []
    for r in rows:
        if "us" not in r:
            continue
        prob = probs[r["problem"]]
        t = Tactic("cuda", **({"kernel": "moe_mma"} | r["tactic"]))    # sweeps before moe_tok stored no kernel
        trials.append(Trial(prob.key, r["m"], t.id, "cuda", t.to_json(), env.device_key, lib, "ok",
                            "bench/moe_latency_h200.py sweep", r["us"], None, 0, None,
                            MOE.verdict(prob, t, arch).smem_bytes,
                            code_key=registry.code_key(t, lib) if code_root is None
                            else code_key_at(lib, code or registry.code_of(t), code_root)))
    with Store(str(path)) as st:
        st.put_environment(env, fam.depends_on)
        for prob in probs.values():
            st.put_problem(prob)
        st.put_trials(trials)
    return len(trials)


def env_of(record: dict) -> Env:
    """An Env from a stored device record (Env.to_dict's form), checked to write the same record back."""
    libs = dict(record["libs"])
    order = [d for d in KNOWN_LIBS if d in libs] + sorted(d for d in libs if d not in KNOWN_LIBS)
    env = Env(record["gpu_name"], record["cc"], int(record["sm_count"]), record["device"], record.get("driver"),
              record.get("cuda_runtime"), record.get("cublas"), record.get("package"),
              tuple((d, libs[d]) for d in order))
    if canonical_json(env.to_dict()) != canonical_json(record):
        raise SystemExit(f"device record {record.get('device_key')} does not rebuild as an Env: {record}")
    return env


def stored_env(cache: Path, device_key: str | None, tmp: Path) -> Env:
    """The environment of a committed cache (.xz decompressed into `tmp`; opened read-only)."""
    if cache.suffix == ".xz":
        cache = copy(cache, tmp / cache.stem)
    with Store(str(cache), readonly=True) as st:
        recs = st.device_records()
    if device_key is None:
        if len(recs) != 1:
            raise SystemExit(f"{cache}: {len(recs)} devices ({', '.join(recs)}): name one with --device-key")
        device_key = next(iter(recs))
    if device_key not in recs:
        raise SystemExit(f"{cache}: no device {device_key} (has {', '.join(recs)})")
    return env_of(recs[device_key])


def git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


def committing_rev(path: str) -> str:
    """The commit that last wrote `path`'s content (the committed run's code; pure renames skipped)."""
    rev = git("log", "-1", "--follow", "--diff-filter=ACM", "--format=%H", "--", path).decode().strip()
    if not rev:
        raise SystemExit(f"{path} is not committed: give --code-rev")
    return rev


def checkout(rev: str, dst: Path) -> Path:
    """autotune/ and tactics/ (the code keys' sources) of `rev` under `dst`."""
    data = git("archive", "--format=tar", rev, "autotune", "tactics")
    tar_path = dst / "src.tar"
    tar_path.write_bytes(data)
    src = dst / "src"
    with tarfile.open(tar_path) as tf:
        tf.extractall(src, filter="tar")
    return src


_DECLARED = """
import json, autotune
from autotune.core.tactic import Tactic
from autotune.tactics import registry
c = registry.code_of(Tactic("cuda", kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1))
print(json.dumps([autotune.__file__, c.member, list(c.modules), [list(f) for f in c.files]]))
"""


def declared_code(src: Path):
    """moe_mma's Code as the checkout under `src` declares it (its module list may differ from this
    install's: a module declared since must not enter the key of a revision that did not declare it)."""
    from autotune.core.codekey import Code
    env = {**os.environ, "PYTHONPATH": str(src)}
    p = subprocess.run([sys.executable, "-c", _DECLARED], cwd=src, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"could not read the revision's code declaration: {p.stderr.strip().splitlines()[-1:]}")
    where, member, modules, files = json.loads(p.stdout.strip().splitlines()[-1])
    if not Path(where).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"the revision's declaration was read from {where}, not from {src}")
    return Code(member, tuple(modules), tuple(tuple(f) for f in files))


def rebuild(doc: dict, out: Path, env: Env, code_root: Path | None, tmp: Path) -> int:
    """store_sweep's cache of `doc`'s sweep at `out` (built in `tmp`, copied once checked); the trial count."""
    fam = registry.get("cuda")
    arch = arch_for_cc(*(int(x) for x in env.cc.split(".")))
    db = tmp / out.name
    code = None if code_root is None else declared_code(code_root)
    n = store_sweep(db, doc["sweep"], fam, arch, env=env, code_root=code_root, code=code)
    with Store(str(db)) as st:
        st.make_self_contained()
    con = sqlite3.connect(db)
    stored = con.execute("select count(*) from trials").fetchone()[0]
    con.close()
    if stored != n or n != doc.get("stored_trials", n):
        raise SystemExit(f"wrote {n} trials, the cache holds {stored}, the run stored {doc.get('stored_trials')}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".xz":              # committed caches are .db.xz
        with open(db, "rb") as src, lzma.open(out, "wb", preset=9) as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(db, out)
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=ROOT / JSON, help="the run's moe_latency.json")
    ap.add_argument("--out", type=Path, default=ROOT / OUT, help="the cache to write (SQLite; .xz: compressed)")
    ap.add_argument("--env-cache", type=Path, default=ROOT / ENV_CACHE,
                    help="a committed cache of the same GPU and libraries (its device record is the run's environment)")
    ap.add_argument("--device-key", help="which device of --env-cache (default: its only one)")
    ap.add_argument("--code-rev", help="the revision that measured (default: the commit that committed --json); "
                    "'installed': the code installed here")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    a = ap.parse_args(argv)
    if a.out.exists() and not a.force:
        raise SystemExit(f"{a.out} exists (--force replaces it)")
    doc = json.loads(a.json.read_text())
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        env = stored_env(a.env_cache, a.device_key, tmp)
        torch_v = dict(env.libs).get("torch")
        if doc.get("gpu") != env.gpu_name or not (torch_v and str(doc.get("torch", "")).split("+")[0] == torch_v):
            raise SystemExit(f"the run ({doc.get('gpu')}, torch {doc.get('torch')}) is not the environment of "
                             f"{a.env_cache} ({env.gpu_name}, torch {torch_v})")
        if a.code_rev is None and not a.json.resolve().is_relative_to(ROOT):
            raise SystemExit(f"{a.json} is outside the repository: give --code-rev")
        rev = a.code_rev or committing_rev(str(a.json.resolve().relative_to(ROOT)))
        code_root = None if rev == "installed" else checkout(rev, tmp)
        n = rebuild(doc, a.out, env, code_root, tmp)
    print(f"wrote {a.out} ({a.out.stat().st_size / 1024:.0f} KiB): {n} trials on {env.gpu_name} "
          f"({env.device_key}, libs {dict(env.libs)}), code of {rev}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

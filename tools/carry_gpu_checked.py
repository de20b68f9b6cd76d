"""Carry the GPU-check record across a change of the digest's form, for kernels whose code did not change.

    python3 tools/carry_gpu_checked.py --old-codekey OLD.py --python PYTHON [--record PATH]

An entry of tactics/cuda/gpu_checked.json certifies that a kernel's code (tactics/cuda/checked.py: its
text, build, layout, pdl and launch modules) passed its GPU tests; its digest is in the code-key form
of its day (autotune.core.codekey._FORM). When only the form changes, the code that passed is still
the code here exactly when the old form's digest of today's files equals the entry's. This tool
computes that digest with OLD.py (the earlier revision's autotune/core/codekey.py, e.g.
`git show f1b1cea:autotune/core/codekey.py > /tmp/old.py`) run by PYTHON (the interpreter the entry
was written with: form 1 depended on it, and the device's is 3.12), and rewrites each equal entry
with today's digest — its log, count, date and GPU kept, `carried` saying from what. An entry whose
old digest differs is left as it is (so its kernel reads `unknown`): its GPU tests must run again.
The file is replaced atomically. Exit 1 with one line if nothing was carried.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# run by PYTHON: OLD.py's digest of each declared Code under ROOT, importing nothing of the project
# (OLD.py's project imports — canonical_json, form 2's measure — are not used by its digest: stubs)
_PROG = """
import json, sys, types, importlib.util
from pathlib import Path
for name in ("autotune", "autotune.core", "autotune.core.tactic", "autotune.core.measure"):
    sys.modules.setdefault(name, types.ModuleType(name))
sys.modules["autotune.core.tactic"].canonical_json = json.dumps
sys.modules["autotune.core"].measure = sys.modules["autotune.core.measure"]
spec = importlib.util.spec_from_file_location("old_codekey", sys.argv[1])
old = importlib.util.module_from_spec(spec)
sys.modules["old_codekey"] = old
spec.loader.exec_module(old)
codes = json.loads(sys.stdin.read())
print(json.dumps({k: old._digest(old.Code(m, tuple(mods), tuple(tuple(f) for f in files)), Path(sys.argv[2]))
                  for k, (m, mods, files) in codes.items()}))
"""


def old_digests(old_codekey: Path, python: str, codes: dict) -> dict[str, str]:
    r = subprocess.run([python, "-c", _PROG, str(old_codekey), str(ROOT)], input=json.dumps(codes),
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{python} could not digest with {old_codekey}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)


def main(argv=None) -> int:
    from autotune.tactics.cuda import checked as C
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-codekey", type=Path, required=True, help="the earlier revision's autotune/core/codekey.py")
    ap.add_argument("--python", required=True, help="the interpreter the record's entries were written with")
    ap.add_argument("--record", type=Path, default=C.RECORD)
    a = ap.parse_args(argv)
    rec = dict(C.record(a.record))
    if not rec:
        print(f"carry_gpu_checked: {a.record}: no entries to carry", file=sys.stderr)
        return 1
    codes = {k: [C.code(k).member, list(C.code(k).modules), [list(f) for f in C.code(k).files]] for k in rec}
    try:
        old = old_digests(a.old_codekey, a.python, codes)
        version = subprocess.run([a.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as e:
        print(f"carry_gpu_checked: {e}", file=sys.stderr)
        return 1
    carried = []
    for k, entry in rec.items():
        if old.get(k) == entry.get("digest") and entry.get("digest") != C.digest(k):
            rec[k] = {**entry, "digest": C.digest(k),
                      "carried": f"earlier-form digest {entry['digest']} of this code (Python {version})"}
            carried.append(k)
    left = sorted(set(rec) - set(carried))
    if not carried:
        print(f"carry_gpu_checked: no entry's code is the code here under the old form ({', '.join(left)} differ)",
              file=sys.stderr)
        return 1
    tmp = a.record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, a.record)
    print(f"carry_gpu_checked: {', '.join(carried)} carried to the current digest form"
          + (f"; {', '.join(left)} left as recorded" if left else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

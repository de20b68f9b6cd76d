"""Where a cuda kernel's warps stall, by phase, from an Nsight Compute source export (no GPU).

    python3 bench/ncu_phases.py NCU_SOURCE.csv[.gz] [--kernel N] [--json OUT]

NCU_SOURCE is `ncu -i REP --page source --print-source sass --csv` (bench/h200_moe_latency.sh writes
it as ncu_source.csv.gz): one section per profiled launch, each SASS line with its warp-stall samples.
Each section is cut at landmarks of the kernel's SASS, in address order: **route** (launch, the id
read, the rank scan and the gather: everything before the first LDGSTS, the ring's first cp.async),
**prologue** (from there to the first DEPBAR, the first wait on the ring), **main loop** (to the last
HMMA) and **epilogue** (after it: split-K partials, SwiGLU, the routing weight, the top_k reduce's
stores, fences, atomics and the last arrival's sums). Address order is not execution order inside a
loop, and code the compiler moved across a landmark is counted on its side of it: a reading aid for
the next design, not a measurement of time. Prints, per section (or only --kernel N, 0-based), the
share of stall samples and of executed instructions in each phase.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common  # noqa: E402

PHASES = ("route", "prologue", "main loop", "epilogue")


def sections(text: str) -> list[tuple[str, list[dict]]]:
    """(kernel name, rows) per profiled launch."""
    out: list[tuple[str, list[dict]]] = []
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith('"Kernel Name"')]
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        name = next(csv.reader([lines[a]]))[1]
        reader = csv.DictReader(io.StringIO("\n".join(lines[a + 1:b])))
        out.append((name, [r for r in reader if r.get("Source")]))
    return out


def _op(src: str) -> str:
    parts = src.split()
    op = parts[1] if parts and parts[0].startswith("@") and len(parts) > 1 else (parts[0] if parts else "")
    return op.split(".")[0]


def phases(rows: list[dict]) -> dict[str, dict[str, float]]:
    ops = [_op(r["Source"]) for r in rows]
    executed = [int(r.get("Instructions Executed") or 0) for r in rows]
    samples = [int(r.get("Warp Stall Sampling (All Samples)") or 0) for r in rows]

    def first(name: str, start: int = 0) -> int | None:
        return next((i for i in range(start, len(ops)) if ops[i] == name and executed[i]), None)
    ldgsts = first("LDGSTS")
    hmma = [i for i, o in enumerate(ops) if o == "HMMA" and executed[i]]
    if ldgsts is None or not hmma:
        raise ValueError("no LDGSTS or no executed HMMA: not a ring-and-MMA kernel")
    depbar = first("DEPBAR", ldgsts)
    cuts = [0, ldgsts, depbar if depbar is not None else hmma[0], hmma[-1] + 1, len(rows)]
    s_tot, e_tot = sum(samples) or 1, sum(executed) or 1
    return {p: {"samples_pct": 100.0 * sum(samples[a:b]) / s_tot, "executed_pct": 100.0 * sum(executed[a:b]) / e_tot}
            for p, a, b in zip(PHASES, cuts, cuts[1:])}


def main(argv=None) -> int:
    ap = common.parser(__doc__)
    ap.add_argument("source", type=common.existing)
    ap.add_argument("--kernel", type=int, help="only this section (0-based, in profiling order)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    a.source = Path(a.source)
    raw = a.source.read_bytes()
    text = (gzip.decompress(raw) if a.source.suffix == ".gz" else raw).decode("utf-8", "replace")
    secs = sections(text)
    if not secs:
        print(f"ncu_phases: {a.source}: no 'Kernel Name' section (not an ncu source export?)", file=sys.stderr)
        return 1
    picked = list(enumerate(secs)) if a.kernel is None else [(a.kernel, secs[a.kernel])] if 0 <= a.kernel < len(secs) else []
    if not picked:
        print(f"ncu_phases: --kernel {a.kernel}: the file has sections 0-{len(secs) - 1}", file=sys.stderr)
        return 1
    out = []
    for i, (name, rows) in picked:
        try:
            ph = phases(rows)
        except ValueError as e:
            print(f"[{i}] {name}: {e}")
            continue
        out.append({"section": i, "kernel": name, "phases": ph})
        print(f"[{i}] {name}: " + ", ".join(f"{p} {v['samples_pct']:.1f} % of stalls ({v['executed_pct']:.1f} % of instructions)"
                                          for p, v in ph.items()))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

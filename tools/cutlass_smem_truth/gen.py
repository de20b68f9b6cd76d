"""The nvcc truth table the cutlass family's verdicts come from (tactics/cutlass/smem_truth.json):
compile host probes with nvcc against CUTLASS and record each kernel's builder Stages and
SharedStorageSize, or nvcc's error.

Manual step, never CI (about 6 s and 1 GB of memory per kernel when batched; a kernel that does
not compile sends its batch to one-at-a-time retries). The enumerated lists, against the CUTLASS
that FlashInfer bundles:
    pip download flashinfer-python==0.7.4 --no-deps -d /tmp/fi
    python3 tools/cutlass_smem_truth/gen.py --wheel /tmp/fi/flashinfer_python-0.7.4-py3-none-any.whl \
        --jobs 2 --out tactics/cutlass/smem_truth.json
More kernels into the same table (kept out of the repository: the CUTLASS headers themselves):
    python3 tools/cutlass_smem_truth/gen.py --cutlass <CUTLASS 4.5.0 checkout> --source-note "<where from>" \
        --set offlist --merge --out tactics/cutlass/smem_truth.json
Kernels whose builder picks < 2 stages are recorded with kernel_smem null (the probe reads the
stage count from the dispatch-policy type so that the batch still compiles); --check-asserts
compiles a few of them fully and records the static_assert text nvcc prints.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from autotune.tactics.cutlass.candidates import Kernel, all_kernels, offlist_neighbours, truth_extras  # noqa: E402
from autotune.tactics.cutlass.smem import MIN_STAGES  # noqa: E402

#: the kernel sets a run can compile: the enumerated lists with their model-pinning extras, and the
#: off-list neighbours whose verdicts would otherwise be unknown (issue #14)
SETS = {"lists": lambda: all_kernels() + truth_extras(), "offlist": offlist_neighbours}

NV = "cutlass::nv_float4_t<cutlass::float_e2m1_t>"
MX = "cutlass::mx_float4_t<cutlass::float_e2m1_t>"
MX8 = "cutlass::mx_float8_t<cutlass::float_e4m3_t>"
G = "cutlass::gemm::"


def call(k: Kernel) -> str:
    """The probe call for one kernel, mirroring how FlashInfer / TensorRT-LLM instantiate it."""
    t = f"{k.tile_m},{k.tile_n},{k.tile_k}"
    b = lambda v: "true" if v else "false"  # noqa: E731
    if k.kernel_arch == "sm120" and k.op == "dense":
        el = {"nvfp4": NV, "mxfp4": MX}[k.format]
        if k.mma == "mxf8f6f4":
            sched, align = (G + ("KernelTmaWarpSpecializedPingpongMxf8f6f4Sm120" if k.schedule == "pingpong"
                                 else "KernelTmaWarpSpecializedMxf8f6f4Sm120")), 128
        else:
            sched, align = (G + ("KernelTmaWarpSpecializedPingpong" if k.schedule == "pingpong"
                                 else "KernelTmaWarpSpecializedCooperative")), 32
        c = "void" if k.epilogue_c == "void" else "cutlass::bfloat16_t"
        return (f"probe_dense_sm120<{t},{el},{el},{align},{align},{sched},{c},{b(k.swap_ab)},"
                f"{b(k.scheduler == 'streamk')}>")
    if k.kernel_arch == "sm120" and k.op == "grouped_moe":
        if k.format == "nvfp4":
            a, w, aa, aw = NV, NV, 32, 32
        else:  # TRT-LLM IsMXFPX on SM120: mx_float8_t activations, mx_float4_t weights (align 128)
            a, w, aa, aw = MX8, MX, 16, 128
        if k.swap_ab:
            a, w, aa, aw = w, a, aw, aa
        return f"probe_moe_sm120<{t},{a},{w},{aa},{aw},{b(k.swap_ab)}>"
    if k.kernel_arch == "sm100" and k.op == "dense":
        sf = "cutlass::float_ue4m3_t" if k.format == "nvfp4" else "cutlass::float_ue8m0_t"
        el = f"cute::tuple<cutlass::float_e2m1_t,{sf}>"
        kind = "Nvf4" if k.format == "nvfp4" else "Mxf4"
        c = "void" if k.epilogue_c == "void" else "cutlass::bfloat16_t"
        return (f"probe_dense_sm100<{t},{el},32,{b(k.schedule == '2sm')},"
                f"{G}KernelTmaWarpSpecialized1Sm{kind}Sm100,{G}KernelTmaWarpSpecialized2Sm{kind}Sm100,{c}>")
    if k.kernel_arch == "sm100" and k.op == "grouped_moe":
        return f"probe_moe_sm100<{t},{b(k.schedule == '2sm')}>"
    raise ValueError(f"no probe for {k.smem_key}")


def target(k: Kernel) -> str:
    return {"sm120": "sm_120a", "sm100": "sm_100a"}[k.kernel_arch]


def compile_run(cutlass: Path, arch: str, body: str, work: Path, tag: str,
                force: bool = False) -> tuple[list[dict], str]:
    src = work / f"{tag}.cu"
    exe = work / tag
    src.write_text(f'#include "probe.cuh"\nint main() {{\n{body}\n  return 0;\n}}\n')
    cmd = ["nice", "-n", "10", "nvcc", "-std=c++17", f"-arch={arch}", f"-I{cutlass}/include", f"-I{HERE}",
           "--expt-relaxed-constexpr", "-w", f"-DFORCE_FULL={int(force)}", str(src), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        errs = [ln for ln in (r.stdout + r.stderr).splitlines() if "error" in ln]
        return [], "\n".join(errs[:3]) or (r.stderr[-400:])
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    exe.unlink()
    return [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")], ""


def batch(cutlass: Path, ks: list[Kernel], work: Path, tag: str) -> list[dict]:
    body = "\n".join(f'  {call(k)}("{k.smem_key}");' for k in ks)
    rows, err = compile_run(cutlass, target(ks[0]), body, work, tag)
    if not err:
        return rows
    if len(ks) == 1:
        msg = re.sub(r"^.*?error: ", "", err.splitlines()[0]) if err else "compile failed"
        return [{"name": ks[0].smem_key, "stages": None, "epi_smem": None, "mainloop_smem": None,
                 "kernel_smem": None, "compile_error": msg.strip()}]
    out = []
    for i, k in enumerate(ks):      # one of them does not compile: find which, one at a time
        out += batch(cutlass, [k], work, f"{tag}_{i}")
    return out


def check_asserts(cutlass: Path, ks: list[Kernel], work: Path) -> dict[str, str]:
    """Fully instantiate the collective of < 2-stage kernels: nvcc must print the static_assert."""
    found = {}
    for i, k in enumerate(ks):
        body = f'  {call(k)}("{k.smem_key}");'
        _, err = compile_run(cutlass, target(k), body, work, f"force{i}", force=True)
        found[k.smem_key] = err.splitlines()[0] if err else ""
    return found


def cutlass_version(cutlass: Path) -> str:
    txt = (cutlass / "include/cutlass/version.h").read_text()
    v = [re.search(rf"#define CUTLASS_{p} (\d+)", txt).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help="flashinfer-python wheel (its data/cutlass is used)")
    ap.add_argument("--cutlass", type=Path, help="a CUTLASS checkout instead of --wheel")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--set", choices=sorted(SETS), default="lists", help="which kernels to compile")
    ap.add_argument("--only", default="", help="substring filter on the smem key")
    ap.add_argument("--merge", action="store_true", help="keep --out's other rows and its provenance")
    ap.add_argument("--source-note", default="", help="where --cutlass came from (e.g. a git tag), recorded")
    ap.add_argument("--check-asserts", type=int, default=2, help="how many < 2-stage kernels to compile fully")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cutlass_truth_"))
    fi_version = None
    if a.wheel:
        with zipfile.ZipFile(a.wheel) as z:
            z.extractall(work, [n for n in z.namelist() if n.startswith("flashinfer/data/cutlass/include/")])
        cutlass = work / "flashinfer/data/cutlass"
        fi_version = re.search(r"flashinfer_python-([^-]+)-", a.wheel.name).group(1)
    elif a.cutlass:
        cutlass = a.cutlass
    else:
        ap.error("give --wheel or --cutlass")
    uniq = {k.smem_key: k for k in SETS[a.set]() if a.only in k.smem_key}
    ks = sorted(uniq.values(), key=lambda k: k.smem_key)
    groups: dict[str, list[Kernel]] = {}
    for k in ks:
        groups.setdefault(target(k), []).append(k)
    chunks = [g[i:i + a.batch] for g in groups.values() for i in range(0, len(g), a.batch)]
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    run = {"cutlass_version": cutlass_version(cutlass), "flashinfer_version": fi_version,
           "cutlass_source": a.source_note or (f"flashinfer-python {fi_version} wheel" if fi_version else str(cutlass)),
           "nvcc": re.search(r"V(\d+\.\d+\.\d+)", nvcc).group(1), "set": a.set, "only": a.only,
           "kernels": len(ks), "date": time.strftime("%Y-%m-%d")}
    meta = {**run, "generator": "tools/cutlass_smem_truth/gen.py"}
    rows: list[dict] = []
    if a.merge and a.out.exists():     # keep the other rows: this run only adds or replaces its own
        old = json.loads(a.out.read_text())
        if old["cutlass_version"] != run["cutlass_version"]:
            raise SystemExit(f"--merge: {a.out} is for CUTLASS {old['cutlass_version']}, not {run['cutlass_version']}")
        rows = [r for r in old.pop("rows") if r["name"] not in uniq]
        meta = {k: v for k, v in old.items() if k not in ("partial",)}
        meta["merges"] = [*old.get("merges", []), run]
    t0 = time.time()
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(batch, cutlass, c, work, f"b{i}") for i, c in enumerate(chunks)]
        for f in cf.as_completed(futs):
            rows += f.result()
            print(f"{len(rows)} rows ({len(ks)} kernels this run), {time.time() - t0:.0f} s", flush=True)
            a.out.write_text(json.dumps({**meta, "partial": True, "rows": sorted(rows, key=lambda r: r["name"])},
                                        indent=1) + "\n")
    one = [uniq[r["name"]] for r in rows if r["name"] in uniq and r.get("stages") is not None
           and r["stages"] < MIN_STAGES[uniq[r["name"]].kernel_arch] and "full_compile_error" not in r]
    asserts = check_asserts(cutlass, one[: a.check_asserts], work) if a.check_asserts else {}
    for r in rows:
        if r["name"] in asserts:
            r["full_compile_error"] = asserts[r["name"]]
    run["seconds"] = round(time.time() - t0)
    if "merges" not in meta:
        meta["seconds"] = run["seconds"]
    a.out.write_text(json.dumps({**meta, "partial": False, "rows": sorted(rows, key=lambda r: r["name"])},
                                indent=1) + "\n")
    print(f"wrote {len(rows)} rows to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The measuring side of a search: one `Bench` holds one (problem, bucket)'s inputs, reference and
built kernels, and answers three requests — setup, check, time.

It runs in-process (`InlineExecutor`) or, by default, in a worker process started with
`python -m autotune.engine.worker` (spawned, never forked, so a parent that initialised CUDA is never
copied). The worker speaks one JSON object per line on its stdin/stdout; anything a kernel or
library prints goes to stderr. After a CUDA error the worker checks whether the context is still
usable and exits when it is not, so one bad tactic costs one worker, not the search.
"""
from __future__ import annotations

import json
import os
import sys
import zlib

from autotune.core import inputs
from autotune.engine import timing
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics import registry
from autotune.tactics.base import PLAIN_LAYOUT

EXIT_POISONED = 3     # the CUDA context is unusable after a tactic's error


class Bench:
    """Inputs, reference and kernels of the current (problem, bucket)."""

    def __init__(self, device: str):
        self.device = device
        self.problem: Problem | None = None
        self.bucket = 0
        self._kernels: dict[str, object] = {}   # tactic id -> kernel, kept across buckets of a problem
        self._weights: list = []                # the problem's random weights, kept across its buckets
        self._graphs: dict[str, dict] = {}      # tactic id -> time_calls memo (its captured graph), this bucket
        self._packs: dict[tuple[str, int], object] = {}  # (layout, set) -> the set's weight packed, this problem
        self._sets: list = []
        self._outs: list = []
        self._ref = None

    def setup(self, problem_key: str, bucket: int, seed: int) -> dict:
        p = Problem.from_key(problem_key)
        if p != self.problem:
            self._kernels.clear()
            self._weights = []
            self._packs.clear()         # packs of the weights just dropped; set i keeps weight i across buckets
        self._graphs.clear()
        self._sets = self._outs = []    # drop the last bucket's tensors before drawing the next
        self._ref = None
        self.problem, self.bucket = p, bucket
        # seeds from crc32: stable across processes, unlike hash()
        n_sets = timing.sets_for_cold_l2(inputs.set_bytes(p, bucket), self.device)
        for i in range(len(self._weights), n_sets):
            self._weights.append(inputs.seeded_weight(p, self.device, zlib.crc32(f"{seed}:{p.key}:w{i}".encode())))
        s0 = zlib.crc32(f"{seed}:{p.key}:{bucket}".encode())
        self._sets = inputs.make_inputs(p, bucket, self.device, s0, n_sets, weights=self._weights)
        self._ref = inputs.reference(p, self._sets[0])
        self._outs = [inputs.torch_empty_out(p, bucket, s) for s in self._sets]
        return {"sets": len(self._sets)}

    def _kernel(self, tactic: Tactic):
        k = self._kernels.get(tactic.id)
        if k is None:
            k = self._kernels[tactic.id] = registry.get(tactic.family).build(self.problem, tactic, self.device)
        return k

    def _args(self, tactic: Tactic, i: int) -> tuple:
        """Set i's arguments with the weight in the tactic's layout, packed once per problem (set i
        uses the problem's weight i in every bucket) as a bound layer packs it at load: a layout's
        packing never runs inside a timed call (or a captured graph)."""
        args = self._sets[i].args()
        fam = registry.get(tactic.family)
        lay = fam.layout(tactic)
        if lay == PLAIN_LAYOUT:
            return args
        w = self._packs.get((lay, i))
        if w is None:
            w = self._packs[(lay, i)] = fam.pack(lay, args[1])
        return (args[0], w, *args[2:])

    def check(self, tactic: Tactic) -> dict:
        """Build (compiling if needed) and compare one call against the float64 reference."""
        kernel = self._kernel(tactic)
        packed = self._args(tactic, 0)[1]
        err = inputs.check(self.problem, lambda x, w, *r, out=None: kernel(x, packed, *r, out=out),
                           self._sets[0], self._ref)
        return {"rel_err": err, "smem_compiled": getattr(kernel, "smem_compiled", None)}

    def time(self, tactic: Tactic, timer: timing.TimerConfig) -> dict:
        kernel = self._kernel(tactic)
        sets, outs = self._sets, self._outs
        memo = self._graphs.setdefault(tactic.id, {})   # later rounds replay the first round's graph
        args = [self._args(tactic, i) for i in range(len(sets))]   # packed before any timing or capture
        t = timing.time_calls(lambda i: kernel(*args[i], out=outs[i]), len(sets), self.device, timer, memo)
        return {"median_us": t.median_us, "iqr_us": t.iqr_us, "reps": t.reps}


def context_usable(device: str) -> bool:
    """False when the CUDA context is poisoned (illegal address / instruction are sticky)."""
    if device != "cuda":
        return True
    import torch
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


def handle(b: Bench, msg: dict) -> dict:
    op = msg["op"]
    if op == "setup":
        return b.setup(msg["problem"], msg["bucket"], msg["seed"])
    if op == "check":
        return b.check(Tactic.from_json(msg["tactic"]))
    if op == "time":
        return b.time(Tactic.from_json(msg["tactic"]), timing.TimerConfig(**msg["timer"]))
    if op == "ping":
        return {"pid": os.getpid()}
    raise ValueError(f"unknown request {op!r}")


def error_text(e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"[:500]


def main() -> int:
    # The protocol owns the real stdout; everything else printed goes to stderr.
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    hello = json.loads(sys.stdin.readline() or "{}")
    for name, path in hello.get("families", {}).items():   # test-only families, registered by path
        registry.FAMILIES.setdefault(name, path)
    b = Bench(hello.get("device", "cpu"))
    proto.write(json.dumps({"ok": True, "ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            reply = {"ok": True, **handle(b, msg)}
        except Exception as e:   # a failing tactic is an answer, not a crash of the worker
            reply = {"ok": False, "error": error_text(e)}
            if not context_usable(b.device):
                reply["poisoned"] = True
                proto.write(json.dumps(reply) + "\n")
                return EXIT_POISONED
        proto.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a search's time and the workers' device memory went: one recorder, summed over workers
(and over Ray tasks, which send theirs back as plain dicts)."""
from __future__ import annotations

import threading


class Stages:
    """Where a search's wall time went: seconds and count per stage (setup, check, time as seen
    by the search, IPC included; store), summed over workers; and the workers' device memory
    (largest peak of a job, largest allocation left after a job, what was kept on purpose then).
    Plain dicts inside, so a Ray task can send its share back (`state` / `merge`)."""

    def __init__(self):
        self.data: dict[str, list] = {}       # stage -> [count, seconds]
        self.memory: dict[str, int] = {}      # peak | after_job | kept_after_job | *reserved* -> largest bytes seen
        self.counts: dict[str, int] = {}      # captures_failed | pools_released | pools_kept -> summed over jobs
        self.worst_job = ""                   # the job that left the most past what it keeps on purpose
        self._lock = threading.Lock()

    def add(self, stage: str, seconds: float, n: int = 1) -> None:
        with self._lock:
            row = self.data.setdefault(stage, [0, 0.0])
            row[0] += n
            row[1] += seconds

    def job_memory(self, figures: dict, job: str = "") -> None:
        """A worker's memory figures at the end of one job (Executor.end_job)."""
        with self._lock:
            if job and isinstance(figures.get("allocated"), int) and isinstance(figures.get("kept"), int):
                over = figures["allocated"] - figures["kept"]
                if over > self.memory.get("over_kept", -1 << 62):
                    self.worst_job = (f"{job}: {over} B allocated past its weights and packs"
                                      + ("; largest live: " + " | ".join(figures["live"]) if figures.get("live") else ""))
            for name in ("captures_failed", "pools_released", "pools_kept"):    # events: summed over jobs and workers
                if isinstance(figures.get(name), int) and figures[name]:
                    self.counts[name] = self.counts.get(name, 0) + figures[name]
            for name, key in (("peak", "peak"), ("after_job", "allocated"), ("kept_after_job", "kept"),
                              ("peak_reserved", "peak_reserved"), ("reserved_after_job", "reserved")):
                if isinstance(figures.get(key), int):
                    self.memory[name] = max(self.memory.get(name, 0), figures[key])
            if isinstance(figures.get("allocated"), int) and isinstance(figures.get("kept"), int):
                over = figures["allocated"] - figures["kept"]
                self.memory["over_kept"] = max(self.memory.get("over_kept", 0), over)

    def state(self) -> dict:
        return {"data": self.data, "memory": self.memory, "counts": self.counts, "worst_job": self.worst_job}

    def merge(self, other: dict) -> None:
        data = other.get("data", other) if "memory" in other or "data" in other else other
        for stage, (n, sec) in data.items():
            self.add(stage, sec, n)
        with self._lock:
            for k, v in other.get("memory", {}).items() if "memory" in other else ():
                self.memory[k] = max(self.memory.get(k, 0), v)
            for k, v in other.get("counts", {}).items() if "memory" in other else ():
                self.counts[k] = self.counts.get(k, 0) + v

    def line(self) -> str:
        return ", ".join(f"{k} {sec:.1f} s ({n}, {1e3 * sec / max(n, 1):.1f} ms each)"
                         for k, (n, sec) in sorted(self.data.items()))

"""A strategy made for the tests, as a user would add one: this file and one `register` line.
Per (problem, bucket) it measures the designated default and the first other kept tactic only."""
from __future__ import annotations

from dataclasses import replace

from autotune.engine.strategies.base import HalvingStrategy


class FirstAndDefault(HalvingStrategy):
    name = "first"
    measured: list = []          # (problem key, bucket) of every job its measure was asked for

    def job(self, s, job, kept_ids):
        others = [t for t in job.tactics if t.id != job.default_id]
        keep = tuple(t for t in job.tactics if t.id == job.default_id) + tuple(others[:1])
        return replace(job, tactics=keep, strategy=self.name), True

    @staticmethod
    def measure(ex, job, timer, h, emit, wait=None):
        FirstAndDefault.measured.append((job.problem.key, job.bucket))
        HalvingStrategy.measure(ex, job, timer, h, emit, wait)

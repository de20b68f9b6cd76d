"""timing.abandon's branches on the CPU, PyTorch's private allocator calls replaced by recorders
(the GPU test, tests/test_workers_gpu.py, checks the memory itself): a failed capture's pool is handed
back only when the allocator was still routing into it, never released twice, and the pool is named
up front because a graph whose capture failed will not tell its own."""
from __future__ import annotations

import pytest
import torch

from autotune.engine import timing


class _Graph:
    """CUDAGraph's pool(): refuses before a capture ended (PyTorch's TORCH_CHECK(capture_ended_))."""

    def __init__(self, ended: bool):
        self.ended = ended

    def pool(self):
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return (0, 7)


@pytest.fixture
def alloc(monkeypatch):
    calls = {"routing": {(0, 7)}, "released": []}

    def end(dev, pool):
        if pool not in calls["routing"]:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        calls["routing"].discard(pool)

    def release(dev, pool):
        calls["released"].append(pool)
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", release, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "ABANDONED", {"captures": 0, "released": 0, "kept": 0})
    return calls


def test_a_capture_that_failed_at_end_capture_hands_its_pool_back(alloc):
    assert timing.abandon(_Graph(ended=False), (0, 7)) == "released"
    assert alloc["routing"] == set() and alloc["released"] == [(0, 7)]
    assert timing.ABANDONED == {"captures": 1, "released": 1, "kept": 0}


def test_a_capture_that_ended_leaves_its_pool_to_the_graph(alloc):
    alloc["routing"].clear()                 # capture_end ended the routing and the capture
    assert timing.abandon(_Graph(ended=True), (0, 7)) == "owned"
    assert alloc["released"] == [] and timing.ABANDONED == {"captures": 1, "released": 0, "kept": 0}


def test_a_capture_that_failed_after_the_routing_ended_counts_its_pool_kept(alloc):
    alloc["routing"].clear()                 # routing ended, capture_end failed later ("Invalid capture")
    assert timing.abandon(_Graph(ended=False), (0, 7)) == "kept"
    assert alloc["released"] == [] and timing.ABANDONED == {"captures": 1, "released": 0, "kept": 1}


def test_without_the_private_calls_the_pool_counts_kept(alloc, monkeypatch):
    monkeypatch.delattr(torch._C, "_cuda_endAllocateToPool")
    assert timing.abandon(_Graph(ended=False), (0, 7)) == "kept"
    assert timing.ABANDONED["kept"] == 1 and alloc["released"] == []


def test_a_failing_release_never_hides_the_capture_error(alloc, monkeypatch):
    def boom(dev, pool):
        raise TypeError("incompatible function arguments")
    monkeypatch.setattr(torch._C, "_cuda_releasePool", boom)
    assert timing.abandon(_Graph(ended=False), (0, 7)) == "kept"

"""Scratch memory the launchers share: the split-K and reduce workspaces, and the bad-id words.

Part of the family interface (the runtime imports it, as it does base.py): a `ScratchPool` is
owned by a Dispatcher (one per dispatcher) and handed to every launcher it binds
(`Launcher.attach`); a launcher made outside the runtime (the search's worker, a test) keeps a
private pool of its own, freed by its `release()`.

Workspaces. `get(stream, name, numel, dtype, device, zero)` returns a buffer of at least `numel`
elements, one per (device, stream, name), grown on demand and never shrunk. Every launch reads and
writes its workspace inside that one launch (split-K partials, the reduce rows; the counters are
left zero by the kernel that used them), so launches that follow each other on one stream may
share it: 75 MoE layers hold one layer's largest workspace, not 75. Launches on two streams get two
buffers, so streams that overlap never race on one.

Graph safety (the rule, tested in tests/test_scratch_pool.py):
* a buffer grows at least by doubling, and the one it outgrows is *retired*, not freed: a CUDA
  graph captured earlier keeps the pointers it captured, and they stay valid. Retired bytes stay
  below the live buffer's (doubling), so the pool holds < 2x the largest need, and exactly the
  largest need when the largest M ran first (`warmup(ms)` runs largest first);
* `trim()` frees the retired buffers: call it only when no graph captured before the last growth
  will be replayed again (`epoch` then changes, so launchers that cached pointers plan again);
* a buffer may grow while a graph is captured (the capture stream has its own buffers; memory
  comes from the graph's pool). A zeroed buffer allocated then is zeroed by the graph at each
  replay but not for eager calls: it is zeroed again on its first `get` outside capture (an eager
  memset, no host sync). `dirty` says such a buffer exists (a launcher must not cache pointers then).

Bad-id words. `word(device, label)` gives one sticky int32 flag (a [1] view, 16-byte aligned) on a
status page of the device; grouped-MoE kernels set it for ids outside [-1, E) (their rows are NaN).
Nothing reads it on the forward path. `errors(clear=True)` reads every page in one device→host copy
per device (a host sync: an engine calls it once per step, or in debug) and returns the labels whose
word is set; clear=True resets those words (read-and-clear), clear=False leaves them set (sticky
until cleared).
"""
from __future__ import annotations

from typing import Any

#: str of each device seen (keys of the pool's buffers)
_DEVICE_NAMES: dict[Any, str] = {}
#: int32 elements per status word: 16 bytes, so every word's pointer keeps Triton's 16-byte specialisation
WORD_STRIDE = 4
#: words per status page (one 4 KiB tensor per device; a page is added when one is full)
PAGE_WORDS = 256


def capturing(device: Any) -> bool:
    """Is the current stream of `device` capturing a CUDA graph? (False on the CPU.)"""
    if getattr(device, "type", device) != "cuda":
        return False
    import torch
    return bool(torch.cuda.is_current_stream_capturing())


def stream_key(device: Any) -> int:
    """The current stream of `device` as an int (0 on the CPU): what `get` keys buffers by, and
    the handle a launch goes on. Read raw (as Triton's launcher does): no Stream object per call."""
    if getattr(device, "type", None) != "cuda":
        return 0
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return int(torch.cuda.current_stream(device).cuda_stream)
    return int(raw(device.index if device.index is not None else torch.cuda.current_device()))


class ScratchPool:
    """Workspaces per (device, stream, name) and bad-id words per device; see the module docs."""

    def __init__(self) -> None:
        self.bufs: dict[tuple[str, int, str], Any] = {}
        self.retired: list[Any] = []
        self.dirty: set[tuple[str, int, str]] = set()
        #: bumped when buffers are freed (trim, clear): pointers cached before it are stale
        self.epoch = 0
        self._pages: dict[str, list[Any]] = {}
        self._labels: dict[str, list[str]] = {}

    # -- workspaces --------------------------------------------------------------------------
    def get(self, stream: int, name: str, numel: int, dtype: Any, device: Any, zero: bool = False) -> Any:
        import torch
        dev = _DEVICE_NAMES.get(device)
        if dev is None:
            dev = _DEVICE_NAMES[device] = str(device)    # str(torch.device) costs ~1 µs per call
        key = (dev, stream, name)
        b = self.bufs.get(key)
        if b is not None and b.numel() >= numel and b.dtype == dtype:
            if self.dirty and key in self.dirty and not capturing(b.device):
                b.zero_()                       # allocated under capture: the memset ran only in the graph
                self.dirty.discard(key)
            return b
        if b is not None:
            self.retired.append(b)              # a graph captured earlier may still point at it
            if b.dtype == dtype:
                numel = max(numel, 2 * b.numel())
        b = (torch.zeros if zero else torch.empty)(numel, dtype=dtype, device=device)
        self.bufs[key] = b
        if zero and capturing(b.device):
            self.dirty.add(key)
        return b

    def dirty_on(self, stream: int) -> bool:
        """Is a buffer of `stream` still to be zeroed (made under a capture)? A launcher must not
        launch on pointers it cached for that stream before `get` zeroes it."""
        return bool(self.dirty) and any(k[1] == stream for k in self.dirty)

    def reserve(self, stream: int, name: str, numel: int, dtype: Any, device: Any, zero: bool = False) -> None:
        """Grow a buffer ahead (before a capture on a stream that has not run the sizes yet)."""
        self.get(stream, name, numel, dtype, device, zero)

    def trim(self) -> int:
        """Free the retired buffers (only when no graph captured before their retirement will be
        replayed again); returns the bytes freed."""
        freed = sum(_nbytes(b) for b in self.retired)
        self.retired.clear()
        self.epoch += 1
        return freed

    def clear(self) -> None:
        """Free every workspace (the bad-id words stay: they carry what was not read yet)."""
        self.bufs.clear()
        self.retired.clear()
        self.dirty.clear()
        self.epoch += 1

    def bytes_held(self, device: Any = None) -> int:
        """Bytes of the live workspaces (of `device`, or all)."""
        return sum(_nbytes(b) for k, b in self.bufs.items() if device is None or k[0] == str(device))

    def bytes_retired(self) -> int:
        return sum(_nbytes(b) for b in self.retired)

    # -- bad-id words ------------------------------------------------------------------------
    def word(self, device: Any, label: str) -> Any:
        """A new sticky int32 word on `device` (a [1] view), zero; `label` names it in `errors()`."""
        import torch
        dev = str(torch.device(device))
        pages, labels = self._pages.setdefault(dev, []), self._labels.setdefault(dev, [])
        slot = len(labels)
        if slot == len(pages) * PAGE_WORDS:
            pages.append(torch.zeros(PAGE_WORDS * WORD_STRIDE, dtype=torch.int32, device=device))
        labels.append(label)
        i = (slot % PAGE_WORDS) * WORD_STRIDE
        return pages[slot // PAGE_WORDS][i:i + 1]

    def errors(self, clear: bool = True, device: Any = None) -> list[str]:
        """The labels whose word is set (one device→host read per device: a host sync). clear=True
        resets the words it found set (read-and-clear); clear=False leaves them set."""
        import torch
        found: list[str] = []
        for dev, pages in self._pages.items():
            if device is not None and dev != str(torch.device(device)):
                continue
            flags = torch.cat(pages).view(-1, WORD_STRIDE)[:, 0]
            hit = (flags != 0).cpu()
            labels = self._labels[dev]
            for slot in hit.nonzero().flatten().tolist():
                found.append(labels[slot])
            if clear and bool(hit.any()):
                for p in pages:
                    p.zero_()
        return found


class PoolUser:
    """Mixin for launchers: a private pool until `attach` gives the dispatcher's, and a sticky
    bad-id word (its own, made on first use, or the attached one). `release()` should clear
    `self._own` (never an attached pool: other layers use it)."""

    scratch: ScratchPool
    _own: ScratchPool
    _bad: Any = None
    _attached_bad: Any = None

    def _init_pool(self) -> None:
        self.scratch = self._own = ScratchPool()
        self._bad = self._attached_bad = None
        self._ptrs: dict[Any, tuple] = {}

    def _pointers(self, key: Any, stream: int, make: Any) -> tuple:
        """`make()`'s buffer pointers (ints) for launches on `stream`, kept per `key` while they
        stay valid: the same pool, its epoch unchanged (nothing freed) and no buffer of that stream
        zeroed under capture still to zero (the pool's rule above). Pointers, not tensors: a trim
        frees what it retires. Saves the pool lookups on every launch (~1 µs each)."""
        pool = self.scratch
        dirty = bool(pool.dirty) and any(k[1] == stream for k in pool.dirty)
        hit = self._ptrs.get(key)
        if hit is not None and hit[0] is pool and hit[1] == pool.epoch and not dirty:
            return hit[2]
        v = make()
        if not (pool.dirty and any(k[1] == stream for k in pool.dirty)) and len(self._ptrs) < 256:
            self._ptrs[key] = (pool, pool.epoch, v)
        return v

    def attach(self, scratch: Any = None, bad_word: Any = None) -> None:
        if scratch is not None:
            self.scratch = scratch
        if bad_word is not None:
            self._attached_bad = bad_word

    def bad_word(self) -> Any:
        return self.bad

    @property
    def bad(self) -> Any:
        """The sticky bad-id word (int32 [1] on the device): the attached one, else its own (None
        before the first call)."""
        return self._attached_bad if self._attached_bad is not None else self._bad

    def _word(self, device: Any) -> Any:
        w = self._attached_bad
        if w is not None and w.device == device:
            return w
        if self._bad is None or self._bad.device != device:
            import torch
            self._bad = torch.zeros(1, dtype=torch.int32, device=device)
        return self._bad


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())

"""Counting what forces a device→host read (a host sync on a GPU), on any device: a
TorchDispatchMode sees every aten op a forward runs, so on CPU tensors it counts what the same
forward would sync on a GPU. Counted: scalar reads (`.item()`, `int(t)`, `bool(t)`, `float(t)`:
aten._local_scalar_dense / is_nonzero / equal), ops whose output size comes from the data
(nonzero, unique*, masked_select, bincount, boolean-mask indexing, repeat_interleave by a tensor
without output_size), copies to the CPU from another device; plus `Tensor.tolist()` and
`Tensor.numpy()`, which read a CPU tensor's memory without dispatching an op."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
#: ops that read device data on the host, whatever their arguments
READS = {aten._local_scalar_dense, aten.item, aten.is_nonzero, aten.equal, aten.nonzero, aten.unique_consecutive,
         aten._unique, aten._unique2, aten.unique_dim, aten.masked_select, aten.bincount, aten.allclose}


def _is_sync(func, args, kwargs) -> bool:
    packet = func.overloadpacket
    if packet in READS:
        return True
    if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
        return (kwargs or {}).get("output_size") is None
    if packet in (aten.index, aten.index_put, aten.index_put_):
        idx = args[1] if len(args) > 1 else ()
        return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (idx or ()))
    if packet in (aten._to_copy, aten.copy_):
        src = args[1] if packet is aten.copy_ else args[0]
        dst_dev = args[0].device if packet is aten.copy_ else (kwargs or {}).get("device")
        return (isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst_dev is not None
                and torch.device(dst_dev).type == "cpu")
    return False


class CountSyncs(TorchDispatchMode):
    """`with CountSyncs() as c: ...` → `c.syncs`: the ops (and tolist/numpy calls) that read device data."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self._saved: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_sync(func, args, kwargs):
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in ("tolist", "numpy"):
            real = self._saved[name] = getattr(torch.Tensor, name)

            def counted(t, *a, _real=real, _name=name, **kw):
                self.syncs.append(f"Tensor.{_name}")
                return _real(t, *a, **kw)
            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, real in self._saved.items():
            setattr(torch.Tensor, name, real)
        return super().__exit__(*exc)

"""fp4-autotune: tune FP4 GEMMs, keep the winners in SQLite, dispatch them at run time.

`autotune.search` and `autotune.dispatch` are the functions; their modules stay importable with
`from autotune.search import …` (the submodules are loaded first so the names bind to the
functions, not the modules).
"""
import autotune.dispatch  # noqa: F401  (load the submodules before rebinding their names)
import autotune.search  # noqa: F401
from autotune.api import search
from autotune.buckets import Buckets
from autotune.dispatch import Dispatcher, dispatch
from autotune.formats import FP4Weight, quantize
from autotune.problem import Problem

__all__ = ["Buckets", "Dispatcher", "FP4Weight", "Problem", "dispatch", "quantize", "search"]

"""The ranking model of `--strategy ranked`: predicted slowness of a tactic at one (problem, bucket).

Features come from what tactics and problems say about themselves, never from family names
written here: every Tactic parameter (numbers as log2, strings one-hot), the family name one-hot,
the verdict's shared-memory bytes, and the family's launch figures (`Family.figures`: programs,
threads, row-tile use) turned into waves and occupancy for the arch; problem features are N, K,
M, the kind, expert count, top_k, formats, the epilogue of a fused form and the arch.

The label is log2(time / best time of that (problem, bucket)), clipped at `CLIP`; failed and
statically rejected tactics get `CLIP` (negatives). A LightGBM regressor is fitted on it
(`fit`, the only part that imports LightGBM) and saved as JSON: metadata, the key (arch, GPU,
library versions) and LightGBM's own text model. `Model.predict` walks those trees in plain
Python, so a search that uses a model needs no LightGBM (and never unpickles anything).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from autotune.core import jsonread
from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

FORMAT = "fp4-autotune-rank-model"
VERSION = 1
#: a model file larger than this is refused unread (a 300-round booster is a few MB)
MAX_BYTES = 256 << 20
#: label ceiling: log2 of "8x slower than the best" (and of failed/rejected tactics)
CLIP = 3.0
#: LightGBM settings (measured in bench/rank_eval.py; small trees, the data is a few 10k rows)
PARAMS = {"objective": "regression", "learning_rate": 0.08, "num_leaves": 31, "min_data_in_leaf": 10,
          "feature_fraction": 0.9, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
          "verbosity": -1, "seed": 0, "deterministic": True, "num_threads": 2}
ROUNDS = 300
MISSING = -1.0     # a feature the tactic does not have (log2 of a positive parameter is >= 0)


def _log2(v: float) -> float:
    return math.log2(v) if v > 0 else MISSING


def features(problem: Problem, tactic: Tactic, m: int, arch: Arch, sms: int, smem: int | None,
             figures: Mapping[str, float]) -> dict[str, float]:
    """One row of named features for (problem, tactic) at M = m on `arch` with `sms` SMs."""
    f = {"n": _log2(problem.n), "k": _log2(problem.k), "m": _log2(m), "pairs": _log2(m * problem.top_k),
         "moe": float(problem.kind == "grouped_moe"), "experts": _log2(problem.experts),
         "top_k": float(problem.top_k), f"w_fmt={problem.w_fmt}": 1.0, f"a_fmt={problem.a_fmt}": 1.0,
         "cc": float(arch.cc_int), "sms": float(sms), f"family={tactic.family}": 1.0,
         "smem_kib": smem / 1024 if smem else MISSING}
    if problem.epilogue != "none":      # a fused form (SwiGLU, the top_k sum); absent for a plain problem,
        f[f"epilogue={problem.epilogue}"] = 1.0     # so models fitted before it existed see nothing new there
    for k, v in tactic.items:
        if isinstance(v, bool):
            f[f"p.{k}"] = float(v)
        elif isinstance(v, (int, float)):
            f[f"p.{k}"] = _log2(v) if v > 0 else float(v)
        elif v is not None:
            f[f"p.{k}={v}"] = 1.0
    ctas, threads = figures.get("ctas"), figures.get("threads")
    if ctas:
        f["waves"] = ctas / max(sms, 1)
        f["log_ctas"] = math.log2(ctas)
        f["m_util"] = float(figures.get("m_util", MISSING))
        if threads and arch.is_gpu:
            by_threads = arch.max_threads_per_sm // int(threads)
            by_smem = arch.smem_per_sm // smem if smem else arch.max_blocks_per_sm
            occ = max(1, min(arch.max_blocks_per_sm, by_threads, by_smem))
            f["occupancy"] = float(occ)
            f["full_waves"] = ctas / (max(sms, 1) * occ)
    return f


def label(median_us: float | None, best_us: float) -> float:
    if median_us is None or not best_us > 0:
        return CLIP
    return min(CLIP, max(0.0, math.log2(median_us / best_us)))


# -- the model -------------------------------------------------------------------------------

@dataclass
class _Tree:
    feature: list[int]
    threshold: list[float]
    decision: list[int]
    left: list[int]
    right: list[int]
    leaf: list[float]
    _arrays: tuple | None = field(default=None, repr=False, compare=False)

    def values(self, X, X0=None):
        """Leaf values for every row of X (numpy [rows, features]); X0 is X with NaN read as 0,
        stored feature-major (`np.asfortranarray`: a level's rows that split on one feature read one
        column) or row-major. LightGBM's rule: a NaN is 0 unless missing values are NaN-typed; the
        missing-type bits (2-3 of decision_type: 1 zero, 2 NaN) send such values to the default
        side (bit 1). A tree without missing-typed splits (what our fits give: no feature is ever
        NaN) walks all rows for its depth with leaves pointing at themselves: three array
        operations a level."""
        import numpy as np
        if not self.feature:
            return np.full(X.shape[0], self.leaf[0])
        if self._arrays is None:        # once per tree, not per call
            self._arrays = _walk_arrays(self)
        feat, thr, dt, left, right, leaf, plain = self._arrays
        if plain:
            X0 = np.asfortranarray(np.where(np.isnan(X), 0.0, X)) if X0 is None else X0
            n, rows = len(dt), X.shape[0]
            if X0.flags.f_contiguous:   # feature f of row i at f * rows + i
                flat, base, stride = X0.ravel(order="F"), np.arange(rows), rows
            else:
                flat, base, stride = np.ascontiguousarray(X0).ravel(), np.arange(rows) * X.shape[1], 1
            node = np.zeros(rows, dtype=np.int64)
            col = feat * stride         # per node: where its feature's values start
            for _ in range(plain):
                node = np.where(flat.take(base + col.take(node)) <= thr.take(node), left.take(node), right.take(node))
            return leaf.take(node - n)
        node = np.zeros(X.shape[0], dtype=np.int64)
        live = np.ones(X.shape[0], dtype=bool)
        while live.any():
            idx = np.nonzero(live)[0]
            nd = node[idx]
            v, d = X[idx, feat[nd]], dt[nd]
            missing = (d >> 2) & 3
            v = np.where(np.isnan(v) & (missing != 2), 0.0, v)
            default = ((missing == 1) & (np.abs(v) <= 1e-35)) | ((missing == 2) & np.isnan(v))
            go_left = np.where(default, (d & 2) != 0, v <= thr[nd])
            node[idx] = np.where(go_left, left[nd], right[nd])
            live[idx] = node[idx] >= 0
        return leaf[~node]


def _walk_arrays(t: _Tree) -> tuple:
    """(feature, threshold, decision, left, right, leaf, depth or 0). Without missing-typed splits
    the nodes are renumbered for the fixed-depth walk: leaf j is node n + j, its own child, with an
    infinite threshold; `depth` is the longest root-to-leaf path. Otherwise LightGBM's numbering."""
    import numpy as np
    dt = np.array(t.decision)
    if ((dt >> 2) & 3).any():
        return (np.array(t.feature), np.array(t.threshold), dt, np.array(t.left), np.array(t.right),
                np.array(t.leaf), 0)
    n, nl = len(t.feature), len(t.leaf)
    stay = np.arange(n, n + nl)
    child = lambda c: np.concatenate([np.where(np.array(c) >= 0, c, n + ~np.array(c)), stay])   # noqa: E731
    left, right = child(t.left), child(t.right)
    depth, frontier = 0, np.array([0])
    while frontier.size:
        depth += 1
        frontier = np.concatenate([left[frontier], right[frontier]])
        frontier = frontier[frontier < n]
    feat = np.concatenate([np.array(t.feature), np.zeros(nl, dtype=np.int64)])
    thr = np.concatenate([np.array(t.threshold, dtype=np.float64), np.full(nl, np.inf)])
    return feat, thr, dt, left, right, np.array(t.leaf), depth


def _parse_trees(text: str) -> list[_Tree]:
    """The trees of a LightGBM text model (numerical splits only: our features are numbers)."""
    trees, cur = [], None
    for line in text.splitlines():
        if line.startswith("Tree="):
            cur = {}
            trees.append(cur)
        elif line.startswith("end of trees"):
            break
        elif cur is not None and "=" in line:
            k, _, v = line.partition("=")
            cur[k] = v
    out = []
    for t in trees:
        if int(t.get("num_cat", "0")):
            raise ValueError("rank model: categorical splits are not supported")
        ints = lambda k: [int(x) for x in t.get(k, "").split()]        # noqa: E731
        floats = lambda k: [float(x) for x in t.get(k, "").split()]    # noqa: E731
        out.append(_Tree(ints("split_feature"), floats("threshold"), ints("decision_type"),
                         ints("left_child"), ints("right_child"), floats("leaf_value")))
    return out


@dataclass
class Model:
    """A fitted ranking model: feature names, the key it was trained under, LightGBM's trees."""

    names: list[str]
    booster: str                          # LightGBM's text model (Booster.model_to_string())
    key: dict                             # {"arch", "gpu", "sms", "libs": {dist: version}}
    info: dict = field(default_factory=dict)   # rows, groups, problems, rounds: what it saw
    _trees: list[_Tree] | None = field(default=None, repr=False)
    _absent: list[float] | None = field(default=None, repr=False)

    def vector(self, f: Mapping[str, float]) -> list[float]:
        """A row in the model's feature order: an absent one-hot feature is 0, an absent number MISSING."""
        return [float(f.get(n, d)) for n, d in zip(self.names, self._defaults())]

    def matrix(self, rows: Iterable[Mapping[str, float]]):
        """`vector` of every row as one numpy [rows, features] array: the defaults, then each row's
        own features written where the model has them (a row names a few of the model's features)."""
        import numpy as np
        col = {n: j for j, n in enumerate(self.names)}
        ri, ci, vs = [], [], []
        i = -1
        for i, f in enumerate(rows):
            for k, v in f.items():
                j = col.get(k)
                if j is not None:
                    ri.append(i)
                    ci.append(j)
                    vs.append(v)
        X = np.tile(np.array(self._defaults(), dtype=np.float64), (i + 1, 1)).reshape(i + 1, len(self.names))
        X[ri, ci] = np.array(vs, dtype=np.float64)
        return X

    def _defaults(self) -> list[float]:
        if self._absent is None or len(self._absent) != len(self.names):
            self._absent = [0.0 if "=" in n else MISSING for n in self.names]
        return self._absent

    def predict(self, rows: Iterable[Mapping[str, float]]) -> list[float]:
        """Predicted log2(time / best) per feature row (numpy only; no LightGBM needed)."""
        import numpy as np
        if self._trees is None:
            self._trees = _parse_trees(self.booster)
        X = self.matrix(rows)
        out = np.zeros(X.shape[0])
        X0 = np.asfortranarray(np.where(np.isnan(X), 0.0, X))
        for t in self._trees:
            out += t.values(X, X0)
        return out.tolist()

    def covers(self, arch: Arch) -> bool:
        return self.key.get("arch") == arch.name

    def bests(self, problem_key: str, bucket: int) -> tuple[str, ...]:
        """The tactic ids its training data timed fastest at (problem, bucket), newest source first
        (`info["bests"]`, rankdata.bests): measured first by a ranked search, since the trees smooth
        over what one run saw, e.g. a sweep of a kernel's new text. () where it holds none or the
        file's entry is not a list of ids."""
        table = self.info.get("bests") if isinstance(self.info, dict) else None
        got = table.get(best_key(problem_key, bucket)) if isinstance(table, dict) else None
        if not isinstance(got, list) or not all(isinstance(i, str) for i in got):
            return ()
        return tuple(got)

    def sibling_bests(self, problem: Problem, bucket: int) -> tuple[str, ...]:
        """The bests (at this bucket) of the grouped problems that are `problem`'s GEMM — kind,
        formats, N, K, epilogue — over one expert and one slot more or fewer: a model whose data
        timed the routed experts (e256:top8) but not the shared expert folded in (e257:top9), or the
        reverse, starts the other from the same fastest tiles. Nearest first, the problem's own
        bests excluded (see `bests`); () for a dense problem."""
        table = self.info.get("bests") if isinstance(self.info, dict) else None
        if problem.kind != "grouped_moe" or not isinstance(table, dict):
            return ()
        tail, near = f"@{int(bucket)}", []
        for key in table:
            if not isinstance(key, str) or not key.endswith(tail):
                continue
            try:
                q = Problem.from_key(key[:-len(tail)])
            except ValueError:
                continue
            d = sibling_distance(problem, q)
            if d is not None:
                near.append((d, q.key, self.bests(q.key, bucket)))
        return tuple(dict.fromkeys(i for _, _, ids in sorted(near) for i in ids))

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "key": self.key, "info": self.info,
                           "features": self.names, "lightgbm": self.booster}, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str, src: str = "rank model") -> "Model":
        return cls.from_doc(jsonread.loads(text, src, max_bytes=MAX_BYTES))

    @classmethod
    def from_doc(cls, d) -> "Model":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not a rank model file")
        if d.get("version") != VERSION:
            raise ValueError(f"rank model version {d.get('version')!r}; this build reads {VERSION}")
        return cls(list(d["features"]), str(d["lightgbm"]), dict(d["key"]), dict(d.get("info", {})))


def sibling_distance(p: Problem, q: Problem) -> int | None:
    """Experts + slots between grouped problems that are one GEMM (kind, formats, N, K, epilogue)
    over at most one expert and one slot more or fewer (the shared expert folded in: e257:top9 beside
    e256:top8); None for any other pair, the problem itself included."""
    if p.kind != "grouped_moe" or q == p:
        return None
    d = (abs(q.experts - p.experts), abs(q.top_k - p.top_k))
    same = (q.kind, q.a_fmt, q.w_fmt, q.out_dtype, q.n, q.k, q.epilogue) == \
        (p.kind, p.a_fmt, p.w_fmt, p.out_dtype, p.n, p.k, p.epilogue)
    return sum(d) if same and max(d) <= 1 else None


def best_key(problem_key: str, bucket: int) -> str:
    """`info["bests"]`'s key of a (problem, bucket)."""
    return f"{problem_key}@{int(bucket)}"


def fit(rows: Sequence[Mapping[str, float]], labels: Sequence[float], key: dict, info: dict | None = None,
        rounds: int = ROUNDS) -> Model:
    """Fit the regressor (imports LightGBM: `pip install 'fp4-autotune[rank]'`)."""
    try:
        import lightgbm as lgb
        import numpy as np
    except ImportError:
        raise ImportError("fitting a rank model needs LightGBM: pip install 'fp4-autotune[rank]'") from None
    names = sorted({n for r in rows for n in r})
    m = Model(names, "", key, dict(info or {}, rounds=rounds))
    data = lgb.Dataset(np.array([m.vector(r) for r in rows]), label=np.array(labels), feature_name=[_safe(n) for n in names],
                       params={"verbosity": -1}, free_raw_data=True)
    m.booster = lgb.train(PARAMS, data, num_boost_round=rounds).model_to_string()
    return m


def _safe(name: str) -> str:
    """LightGBM refuses some characters in feature names; the JSON keeps the real names."""
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name)


# -- where models live ------------------------------------------------------------------------

def path_for(cache_path: str | os.PathLike, arch: Arch) -> Path:
    """The model file next to a SQLite cache file: `<cache>.rank-<arch>.json`."""
    p = Path(cache_path)
    return p.with_name(f"{p.name}.rank-{arch.name}.json")


def load(path: str | os.PathLike) -> Model:
    """A model file: JSON, or gzip'd JSON (`.json.gz`, the shipped models: a third of the size);
    bounded: at most MAX_BYTES unpacked, nested at most jsonread.MAX_DEPTH (ValueError)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        import gzip
        try:
            with gzip.GzipFile(fileobj=__import__("io").BytesIO(raw)) as f:
                raw = f.read(MAX_BYTES + 1)
        except (OSError, EOFError) as e:
            raise ValueError(f"damaged gzip: {e}") from None
    return Model.from_doc(jsonread.loads(raw, str(path), max_bytes=MAX_BYTES))


def save(model: Model, path: str | os.PathLike) -> Path:
    """Written whole or not at all (a temporary file, then renamed); `.gz`: gzip'd, byte-identical
    for the same model (no timestamp)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    data = model.to_json().encode()
    if p.suffix == ".gz":
        import gzip
        data = gzip.compress(data, 9, mtime=0)
    tmp.write_bytes(data)
    os.replace(tmp, p)
    return p

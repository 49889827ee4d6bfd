"""GiGPO advantages: episode-level (A_E) plus anchor-state step-level (A_S).

Implements the advantage estimator of *Group-in-Group Policy Optimization for
LLM Agent Training* (Feng et al., arXiv 2505.10978), Sec. 3:

* Sec. 3.1, episode-level relative advantage: every rollout of a task group is
  scored by its total return ``R_tau`` and normalised against the group,
  ``A_E = (R_tau - mean) / F_norm`` with ``F_norm = 1`` ("mean_norm") or the
  group standard deviation ("mean_std_norm").
* Sec. 3.2, anchor-state grouping: rows (one row = one agent turn) of the
  same task group that were taken from the same environment state form a
  *step group*; the step-level relative advantage ``A_S`` normalises each
  row's discounted return ``G_t`` against its step group in the same way.
* Sec. 3.3, combined advantage ``A = A_E + omega * A_S`` (``omega = 0`` is
  GRPO's advantage).

Optionally (``step_grouping="hierarchical"``) the advantage is that of
*Hierarchy-of-Groups Policy Optimization for Long-Horizon Agentic Tasks*
(HGPO, He, Feng et al., arXiv 2602.22817) as its authors' recipe computes it
(OliverLeeXZ/SERL ``recipe/hgpo/core_hgpo.py``): rows that share the current
and the last ``k = 0..K`` anchor states of their trajectory form nested
groups, and the advantage is the weighted mean of the non-zero per-level
advantages (see :func:`compute_gigpo_advantages`).

The numerical conventions follow the reference implementation that produced
the paper's tables (invalid-action penalty, per-row episode statistics,
``A_S = 0`` for a singleton step group, ``1e-6`` added to the standard
deviation), except for a task group left with one trajectory: ``A_E = A_S =
0`` there, where the reference would pass the raw return through (see
:func:`compute_gigpo_advantages`, Notes).

This module depends on numpy, torch and rapidfuzz only (no Trainer) and is
vectorised: group statistics are segment reductions (``np.bincount``), the
discounted returns a logarithmic-depth pointer-jumping scan, so the work is
``O(R log R)`` for ``R`` rows with no Python loop per row or per group (the
optional fuzzy anchor matching loops over task groups, see
:func:`compute_gigpo_advantages`).
"""

from __future__ import annotations

import collections
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from rapidfuzz.distance import Indel

__all__ = ["AdvantageResult", "compute_gigpo_advantages"]

#: Added to the standard deviation in ``mean_std_norm`` (as the reference does).
STD_EPS = 1e-6
#: Added to the sum of HGPO's item weights (as the authors' recipe does).
WEIGHT_EPS = 1e-6

_MODES = ("mean_norm", "mean_std_norm")
_EPISODE_STATS = ("rows", "trajectories")
_STEP_GROUPINGS = ("state", "hierarchical")
#: Anchor element types used as dictionary keys without conversion.
_PLAIN_TYPES = frozenset({str, int, float, bool, bytes, complex, type(None)})
#: Buckets of the hashed character-bigram profiles used to prune fuzzy pairs.
_BIGRAM_BUCKETS = 2048


@dataclass
class AdvantageResult:
    """Per-row output of :func:`compute_gigpo_advantages`.

    Every field has shape ``(R,)``, one entry per input row, in input order.
    Float fields are ``torch`` tensors (dtype and device of ``rewards``, or the
    default float dtype if ``rewards`` is an integer tensor) when ``rewards``
    is a tensor, else ``numpy.float64`` arrays. Integer fields are ``int64``
    (``torch.long`` on the same device for tensor input).

    Attributes
    ----------
    episode_advantages : A_E, episode-level relative advantage (Sec. 3.1).
    step_advantages : A_S, step-level relative advantage (Sec. 3.2); for
        ``step_grouping="hierarchical"`` HGPO's weighted advantage (equal to
        ``advantages``).
    advantages : ``A_E + omega * A_S`` (Sec. 3.3); HGPO's weighted advantage
        for ``step_grouping="hierarchical"``.
    step_returns : discounted return ``G_t`` of the row (reward units) minus the
        row's invalid-action penalty; the quantity that ``A_S`` normalises.
    anchor_group_ids : step group of the row, labels ``0..K-1``. Two rows
        share a label iff they share a step group; the label values are an
        implementation detail (they may change when rows are permuted).
    episode_returns : ``R_tau``, undiscounted, unpenalised return of the row's
        trajectory.
    anchor_group_sizes : number of rows in the row's step group (>= 1).
    level_group_ids : ``(R, K + 1)`` int, column ``k`` the row's HGPO group
        ``G_k`` (context: the current and ``k`` previous anchor states;
        column 0 equals ``anchor_group_ids``), ``-1`` where the row is at a
        turn ``t < k`` and has no level ``k``; ``K = 0`` for
        ``step_grouping="state"``. Labels as for ``anchor_group_ids``.
    level_group_sizes : ``(R, K + 1)`` int, number of rows in each ``G_k``
        (non-increasing along a row: the groups are nested), 0 where the row
        has no level ``k``.
    """

    episode_advantages: Any
    step_advantages: Any
    advantages: Any
    step_returns: Any
    anchor_group_ids: Any
    episode_returns: Any
    anchor_group_sizes: Any
    level_group_ids: Any = None
    level_group_sizes: Any = None


# --------------------------------------------------------------------------
# input validation and conversion
# --------------------------------------------------------------------------


def _to_numpy(x: Any) -> Any:
    """Torch tensors become numpy arrays (bfloat16 via float32); rest as is."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return x


def _check_length(x: Any, name: str, n: int) -> None:
    try:
        m = len(x)
    except TypeError:
        raise TypeError(f"{name} must be a sequence, array or tensor of length {n}, got {type(x).__name__}") from None
    if m != n:
        raise ValueError(f"{name} has length {m} but rewards has length {n}")


def _as_rewards(rewards: Any) -> np.ndarray:
    arr = _to_numpy(rewards)
    try:
        arr = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError("rewards must contain real numbers") from None
    if arr.ndim != 1:
        raise ValueError(f"rewards must be 1-D of shape (R,), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("rewards must be finite (found NaN or inf)")
    return arr


def _as_valid(action_valid: Any, n: int) -> np.ndarray:
    if action_valid is None:
        return np.ones(n, dtype=bool)
    _check_length(action_valid, "action_valid", n)
    arr = np.asarray(_to_numpy(action_valid))
    if arr.ndim != 1:
        raise ValueError(f"action_valid must be 1-D of shape (R,), got shape {arr.shape}")
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind in "iuf" and np.isin(arr, (0, 1)).all():
        return arr.astype(bool)
    raise ValueError("action_valid must be boolean (or 0/1)")


def _as_scalar(value: Any, name: str, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not (math.isfinite(v) and low <= v <= high):
        raise ValueError(f"{name} must be finite and in [{low}, {high}], got {value!r}")
    return v


# --------------------------------------------------------------------------
# step 1: integer codes for task groups, trajectories and anchor states
# --------------------------------------------------------------------------


def _factorize_hashables(seq: list, name: str) -> tuple[np.ndarray, list]:
    """Codes ``0..U-1`` (first-appearance order) and the unique keys of ``seq``.

    One pass in C: a ``defaultdict`` whose factory hands out the next code.
    Equality is Python's (so ``1 == 1.0 == True`` share a code).
    """
    table = collections.defaultdict(itertools.count().__next__)
    try:
        codes = np.fromiter(map(table.__getitem__, seq), dtype=np.int64, count=len(seq))
    except TypeError as err:
        raise TypeError(f"{name} must contain hashable values ({err})") from None
    return codes, list(table)


def _dense_codes(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Relabel non-negative integer ``keys`` as ``0..K-1`` (ascending key order).

    Linear time through a presence table when ``max(keys)`` is at most a small
    multiple of ``len(keys)``; otherwise a sort (``np.unique``).
    """
    if len(keys) == 0:
        return keys.astype(np.int64), 0
    top = int(keys.max())
    if top < 8 * len(keys) + 1024:
        present = np.zeros(top + 1, dtype=bool)
        present[keys] = True
        uniq = np.flatnonzero(present)
        remap = np.empty(top + 1, dtype=np.int64)
        remap[uniq] = np.arange(len(uniq), dtype=np.int64)
        return remap[keys], len(uniq)
    uniq, inverse = np.unique(keys, return_inverse=True)
    return inverse.astype(np.int64, copy=False), len(uniq)


def _factorize(values: Any, name: str) -> tuple[np.ndarray, int]:
    """Integer codes ``0..U-1`` and ``U`` of an ``(R,)`` array/tensor/sequence of ids."""
    values = _to_numpy(values)
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.ndim != 1:
            raise ValueError(f"{name} must be 1-D of shape (R,), got shape {values.shape}")
        if values.dtype.kind in "iub":
            return _dense_codes(values.astype(np.int64) - int(values.min()))
        uniq, inverse = np.unique(values, return_inverse=True)
        return inverse.astype(np.int64, copy=False), len(uniq)
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    codes, uniques = _factorize_hashables(seq, name)
    return codes, len(uniques)


class _Tag:
    """Private marker so that converted containers never equal user tuples."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<{self.name}>"


_NDARRAY, _LIST, _DICT, _SET = _Tag("ndarray"), _Tag("list"), _Tag("dict"), _Tag("set")
_NAN = _Tag("nan")  # every NaN is one anchor value: identity, payload and sign must not matter (pickling)


def _float_key(v: float) -> Any:
    """NaN -> one key; ``-0.0`` -> ``0.0`` (equal as numbers, so one key in every container)."""
    return _NAN if v != v else v + 0.0


def _canonical_floats(x: np.ndarray) -> np.ndarray:
    """A float/complex array with one NaN bit pattern and ``-0.0`` as ``0.0``, so equal values give equal bytes."""
    if x.dtype.kind == "c":
        out = np.empty_like(x)
        out.real, out.imag = _canonical_floats(x.real), _canonical_floats(x.imag)
        return out
    return np.where(np.isnan(x), np.array(np.nan, dtype=x.dtype), x + x.dtype.type(0))


def _anchor_key(x: Any) -> Any:
    """Stable hashable key of one raw observation (exact anchor matching).

    * ``str``/``bytes``/numbers/``None``/other hashable objects: the object
      itself (Python equality; note ``1 == 1.0``), except that floats are
      compared by value: every NaN equals every NaN (not only itself, an
      identity that pickling to and from env workers breaks) and ``-0.0``
      equals ``0.0``, alone and inside any container or array.
    * ``numpy.ndarray`` / ``torch.Tensor``: ``(shape, dtype, raw bytes)``, so
      equal arrays match and arrays of different shape or dtype never do.
    * ``tuple``: tuple of keys; ``list``: likewise, tagged (a list never equals
      a tuple); ``dict``: frozenset of ``(key, value)`` keys, so key order is
      irrelevant; ``set``/``frozenset``: frozenset of keys. All recursive.

    Raises ``TypeError`` for anything else that is unhashable.
    """
    tx = type(x)
    if tx is float:
        return _float_key(x)
    if isinstance(x, np.floating):
        return _float_key(float(x) if x.itemsize <= 8 else x)
    if tx is complex or isinstance(x, np.complexfloating):
        return (_NAN, _float_key(x.real), _float_key(x.imag)) if x != x else x
    if tx in _PLAIN_TYPES:
        return x
    if isinstance(x, torch.Tensor):
        x = _to_numpy(x)
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return (_NDARRAY, x.shape, "O", tuple(map(_anchor_key, x.ravel().tolist())))
        if x.dtype.kind in "fc":
            x = _canonical_floats(x)
        return (_NDARRAY, x.shape, x.dtype.str, np.ascontiguousarray(x).tobytes())
    if isinstance(x, tuple):
        return tuple(map(_anchor_key, x))
    if isinstance(x, list):
        return (_LIST, tuple(map(_anchor_key, x)))
    if isinstance(x, dict):
        return (_DICT, frozenset((_anchor_key(k), _anchor_key(v)) for k, v in x.items()))
    if isinstance(x, (set, frozenset)):
        return (_SET, frozenset(map(_anchor_key, x)))
    try:
        hash(x)
    except TypeError:
        raise TypeError(f"unhashable anchor of type {tx.__name__}") from None
    return x


def _exact_anchor_codes(anchor_states: Any) -> tuple[np.ndarray, int]:
    """Codes ``0..U-1`` and ``U`` of the anchors under exact matching (see :func:`_anchor_key`)."""
    anchors = _to_numpy(anchor_states)
    if isinstance(anchors, np.ndarray) and anchors.dtype != object:
        if anchors.ndim == 1:  # numbers or fixed-width strings
            return _factorize(anchors, "anchor_states")
        # (R, ...) numeric array: each row is an ndarray anchor, keyed by its (canonical) bytes.
        if anchors.dtype.kind in "fc":
            anchors = _canonical_floats(anchors)
        rows = np.ascontiguousarray(anchors.reshape(len(anchors), -1))
        void = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
        uniq, inverse = np.unique(void, return_inverse=True)
        return inverse.astype(np.int64, copy=False), len(uniq)
    seq = anchors.tolist() if isinstance(anchors, np.ndarray) and anchors.ndim == 1 else list(anchors)
    if not set(map(type, seq)) <= _PLAIN_TYPES - {float, complex}:  # floats too: NaN and -0.0 need a key
        try:
            seq = list(map(_anchor_key, seq))
        except TypeError as err:
            raise TypeError(f"anchor_states: {err}") from None
    codes, uniques = _factorize_hashables(seq, "anchor_states")
    return codes, len(uniques)


def _pair_codes(outer: np.ndarray, inner: np.ndarray, n_inner: int) -> tuple[np.ndarray, int]:
    """Codes of the ``(outer, inner)`` pairs, e.g. (task group, anchor) or (task group, trajectory).

    If every inner code occurs with one outer code only (the usual case), the
    inner codes already are the pair codes (linear time check).
    """
    outer_of_inner = np.empty(n_inner, dtype=np.int64)
    outer_of_inner[inner] = outer
    if np.array_equal(outer_of_inner[inner], outer):
        return inner, n_inner
    return _dense_codes(outer * n_inner + inner)


def _bigram_profiles(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Hashed character-bigram counts ``(n, B)`` and lengths ``(n,)`` of texts."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    owner = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
    inside = owner[1:] == owner[:-1]  # bigram within one text
    bucket = (codes[:-1] * 1_000_003 + codes[1:]) % _BIGRAM_BUCKETS
    flat = owner[:-1][inside] * _BIGRAM_BUCKETS + bucket[inside]
    profiles = np.bincount(flat, minlength=len(texts) * _BIGRAM_BUCKETS)
    return profiles.reshape(len(texts), _BIGRAM_BUCKETS), lengths


def _similarity_upper_bounds(texts: list[str]) -> np.ndarray:
    """Upper bounds ``(n, n)`` of the normalised Indel similarity of text pairs.

    One insertion or deletion changes the bigram multiset of a text by at most
    3 (q-gram lemma, ``2q - 1``), so the Indel distance ``d >= L1 / 3`` with
    ``L1`` the L1 distance of the bigram count vectors (hashing bigrams into
    buckets only lowers ``L1``); also ``d >= |len_a - len_b|``. Hence
    ``sim = 1 - d / (len_a + len_b) <= 1 - max(L1 / 3, |dlen|) / (len_a + len_b)``.
    ``L1 = |x| + |y| - 2 sum(min(x, y))`` and ``sum(min(x, y)) =
    sum_k (x >= k) . (y >= k)`` are computed exactly with a few matrix products.
    """
    P, lengths = _bigram_profiles(texts)
    colmax = P.max(axis=0)
    low = colmax <= 8
    shared = np.zeros((len(texts), len(texts)))
    for k in range(1, int(colmax[low].max(initial=0)) + 1):
        X = (P[:, low & (colmax >= k)] >= k).astype(np.float32)  # exact: integer sums < 2**24
        shared += X @ X.T
    high = P[:, ~low]  # the few very frequent buckets (e.g. "e ", "  ")
    shared += np.minimum(high[:, None, :], high[None, :, :]).sum(axis=2)
    totals = P.sum(axis=1).astype(np.float64)
    l1 = totals[:, None] + totals[None, :] - 2.0 * shared
    dist_lb = np.maximum(l1 / 3.0, np.abs(lengths[:, None] - lengths[None, :]))
    both = (lengths[:, None] + lengths[None, :]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(both > 0, 1.0 - dist_lb / both, 1.0)


def _union_find_root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _similar_anchor_codes(anchor_states: Any, group_codes: np.ndarray, threshold: float) -> np.ndarray:
    """Step-group codes under fuzzy matching; never merges across task groups.

    Two anchors are *similar* iff ``Indel.normalized_similarity(a, b) >=
    threshold``, i.e. ``rapidfuzz.fuzz.ratio(a, b) / 100 >= threshold``
    (``1 - indel_distance / (len(a) + len(b))``; two empty strings: 1). Step
    groups are the connected components of the "similar" graph within a task
    group (transitive closure: ``a~b`` and ``b~c`` put ``a, b, c`` together
    even if ``a!~c``). Components do not depend on row order.

    Exact duplicates are merged first; pairs of distinct texts are pruned by
    :func:`_similarity_upper_bounds` and by skipping pairs already in one
    component, the rest are scored by rapidfuzz (C++).
    """
    anchors = _to_numpy(anchor_states)
    seq = anchors.tolist() if isinstance(anchors, np.ndarray) else list(anchors)
    bad = [t for t in set(map(type, seq)) if not issubclass(t, str)]
    if bad:
        raise TypeError(
            f"anchor_states must contain only str when similarity_threshold is set, found {bad[0].__name__}"
        )
    text_codes, texts = _factorize_hashables(seq, "anchor_states")
    # unique (task group, text) pairs, sorted by task group
    pair_keys, pair_of_row = np.unique(group_codes * len(texts) + text_codes, return_inverse=True)
    pair_group, pair_text = np.divmod(pair_keys, len(texts))
    parent = list(range(len(pair_keys)))
    bounds_of_group = np.flatnonzero(np.diff(pair_group, prepend=-1, append=-1))
    for lo, hi in zip(bounds_of_group[:-1].tolist(), bounds_of_group[1:].tolist()):  # loop over task groups
        if hi - lo < 2:
            continue
        group_texts = [texts[t] for t in pair_text[lo:hi].tolist()]
        upper = _similarity_upper_bounds(group_texts)
        ii, jj = np.nonzero(np.triu(upper >= threshold - 1e-12, k=1))
        order = np.argsort(-upper[ii, jj], kind="stable")  # likeliest first: more skips
        for i, j in zip(ii[order].tolist(), jj[order].tolist()):
            ri, rj = _union_find_root(parent, lo + i), _union_find_root(parent, lo + j)
            if ri == rj:
                continue
            if Indel.normalized_similarity(group_texts[i], group_texts[j], score_cutoff=threshold) >= threshold:
                parent[max(ri, rj)] = min(ri, rj)
    roots = np.fromiter((_union_find_root(parent, p) for p in range(len(parent))), dtype=np.int64, count=len(parent))
    return roots[pair_of_row]


# --------------------------------------------------------------------------
# step 1b: turn order within a trajectory, and HGPO's history contexts
# --------------------------------------------------------------------------


def _max_code(codes: np.ndarray) -> int:
    return int(codes.max()) if len(codes) else 0


def _next_rows(traj_codes: np.ndarray) -> np.ndarray:
    """``(R + 1,)`` int: the next row of each row's trajectory in input (turn) order, ``R`` after its last row.

    Index ``R`` is a sentinel pointing at itself. Other trajectories may be interleaved.
    """
    n = len(traj_codes)
    nxt = np.full(n + 1, n, dtype=np.int64)
    if n > 1 and bool((traj_codes[1:] >= traj_codes[:-1]).all()):  # already grouped: no sort
        same = np.flatnonzero(traj_codes[1:] == traj_codes[:-1])
        nxt[same] = same + 1
    else:
        small = traj_codes.astype(np.uint16) if _max_code(traj_codes) <= np.iinfo(np.uint16).max else traj_codes
        order = np.argsort(small, kind="stable")  # radix sort for uint16
        same = traj_codes[order[1:]] == traj_codes[order[:-1]]
        nxt[order[:-1][same]] = order[1:][same]
    return nxt


def _previous_rows(nxt: np.ndarray) -> np.ndarray:
    """``(R + 1,)`` int: the previous row of each row's trajectory, ``R`` (the sentinel) at its first row."""
    n = len(nxt) - 1
    prev = np.full(n + 1, n, dtype=np.int64)
    linked = np.flatnonzero(nxt[:n] < n)
    prev[nxt[linked]] = linked
    return prev


def _context_codes(step_codes: np.ndarray, n_steps: int, prev: np.ndarray, depth: int) -> list:
    """HGPO's history contexts, levels ``k = 0..depth`` (recipe ``recipe/hgpo/core_hgpo.py``, HGPO arXiv 2602.22817).

    The level-``k`` context of a row at turn ``t`` is its task group and the anchor states of turns
    ``t - k .. t`` of its own trajectory (``k + 1`` observations, no actions); it exists only for ``t >= k``.
    Built one level at a time, ``c_k = code(c_{k-1}, step code of the row k turns back)``, so the groups nest
    (``G_0 ⊇ G_1 ⊇ …``) and revisits by one trajectory stay separate members. Returns ``[(codes_k, n_k)]``,
    ``codes_k`` ``(R,)`` with ``-1`` where the row has no level ``k``; level 0 is GiGPO's step group.
    """
    n = len(step_codes)
    levels = [(step_codes, n_steps)]
    codes, n_codes, back = step_codes, n_steps, prev[:n]
    for _ in range(depth):
        has = back < n  # the row has k earlier turns (and hence a level k - 1 context)
        new = np.full(n, -1, dtype=np.int64)
        new[has], n_codes = _dense_codes(codes[has] * n_steps + step_codes[back[has]])
        levels.append((new, n_codes))
        codes, back = new, prev[back]
    return levels


# --------------------------------------------------------------------------
# step 2: returns
# --------------------------------------------------------------------------


def _discounted_returns(rewards: np.ndarray, traj_codes: np.ndarray, gamma: float, nxt: np.ndarray) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}``, 0 after each trajectory's last row.

    ``nxt`` from :func:`_next_rows`. A linear-recurrence scan by pointer
    jumping: after ``k`` rounds ``G[i] = sum_{j < 2^k} gamma^j r_{i+j}``;
    ``ceil(log2(T_max))`` rounds of vector ops, only products of
    ``gamma <= 1`` (no ``gamma^-t`` scaling), so exact to float64 rounding for
    any ``gamma`` in [0, 1] and any trajectory length. A truncated trajectory
    is treated as terminal.
    """
    n = len(rewards)
    nxt = nxt.copy()  # the rounds below jump it in place
    G = np.zeros(n + 1)
    G[:n] = rewards
    coef = np.where(nxt < n, gamma, 0.0)  # 0 at the last row and the sentinel
    # in-place rounds with preallocated buffers (large temporaries cost page faults)
    tmp, nxt_buf = np.empty(n + 1), np.empty(n + 1, dtype=np.int64)
    longest = int(np.bincount(traj_codes).max())
    for _ in range(max(0, math.ceil(math.log2(longest)))):
        np.take(G, nxt, out=tmp)
        np.multiply(tmp, coef, out=tmp)
        np.add(G, tmp, out=G)  # G[i] += coef[i] * G[nxt[i]] (old values, gathered first)
        np.take(coef, nxt, out=tmp)
        np.multiply(coef, tmp, out=coef)
        np.take(nxt, nxt, out=nxt_buf)
        nxt, nxt_buf = nxt_buf, nxt
    return G[:n]


# --------------------------------------------------------------------------
# step 3-4: group normalisation (segment ops)
# --------------------------------------------------------------------------


def _group_moments(values: np.ndarray, segments: np.ndarray, n_segments: int, ddof: int = 1):
    """Shifted moments of ``values`` per segment.

    Returns ``(ref, mean_shift, std, count)`` with the segment mean equal to
    ``ref + mean_shift``; ``ref`` is one member's value, so a segment whose
    members are all equal gets ``values - ref == 0`` and ``mean_shift == 0``
    exactly. ``std`` divides by ``count - ddof``: ``ddof=1`` Bessel's
    correction (GiGPO, ``torch.std``), ``ddof=0`` the population std (HGPO's
    levels); 0 for a singleton.
    """
    count = np.bincount(segments, minlength=n_segments)
    ref = np.zeros(n_segments)
    ref[segments] = values  # any member will do
    shifted = np.subtract(values, ref[segments])
    mean_shift = np.bincount(segments, weights=shifted, minlength=n_segments) / np.maximum(count, 1)
    dev = np.take(mean_shift, segments)
    np.subtract(shifted, dev, out=dev)
    np.square(dev, out=dev)
    std = np.sqrt(np.bincount(segments, weights=dev, minlength=n_segments) / np.maximum(count - ddof, 1))
    return ref, mean_shift, std, count


def _normalise(x, seg, ref, mean_shift, std, mode):
    """``(x - mean[seg]) / F_norm`` with ``mean = ref + mean_shift`` (in place on one buffer)."""
    out = np.take(ref, seg)
    np.subtract(x, out, out=out)
    out -= np.take(mean_shift, seg)
    if mode == "mean_std_norm":
        out /= np.take(std, seg) + STD_EPS
    return out


def _episode_advantages(episode_scores, R_tau, group_codes, traj_codes, n_groups, n_traj, mode, episode_stats):
    """A_E (Sec. 3.1). A singleton population uses mean 0, std 1 (the reference's convention; its rows are then
    zeroed by the lone-trajectory rule in :func:`compute_gigpo_advantages`)."""
    if episode_stats == "rows":
        values, seg = episode_scores, group_codes
    else:
        traj_group = np.zeros(n_traj, dtype=np.int64)
        traj_group[traj_codes] = group_codes
        values, seg = R_tau, traj_group
    ref, mean_shift, std, count = _group_moments(values, seg, n_groups)
    single = count == 1
    ref[single], mean_shift[single], std[single] = 0.0, 0.0, 1.0
    return _normalise(episode_scores, group_codes, ref, mean_shift, std, mode)


def _lone_trajectory_rows(group_codes, traj_codes, n_groups, n_traj) -> np.ndarray:
    """``(R,)`` bool: rows of task groups that hold a single trajectory (e.g. the other members failed)."""
    traj_group = np.zeros(n_traj, dtype=np.int64)
    traj_group[traj_codes] = group_codes
    return (np.bincount(traj_group, minlength=n_groups) == 1)[group_codes]


def _step_advantages(step_scores, step_codes, n_steps, mode, ddof=1):
    """A_S (Sec. 3.2) within the groups ``step_codes``; a singleton group gets 0. Returns ``(A_S, count)``."""
    ref, mean_shift, std, count = _group_moments(step_scores, step_codes, n_steps, ddof)
    A_S = _normalise(step_scores, step_codes, ref, mean_shift, std, mode)
    A_S[count[step_codes] == 1] = 0.0
    return A_S, count


def _level_advantages(G: np.ndarray, codes: np.ndarray, n_codes: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """HGPO's per-level advantage ``A_k`` ``(R,)`` and group size ``(R,)`` int; both 0 where the row has no level
    ``k`` (``codes == -1``). Population std (``ddof=0``) + 1e-6 in ``mean_std_norm``, as the recipe computes it."""
    if (codes >= 0).all():
        A_k, count = _step_advantages(G, codes, n_codes, mode, ddof=0)
        return A_k, count[codes]
    has = codes >= 0
    A_k, sizes = np.zeros(len(G)), np.zeros(len(G), dtype=np.int64)
    A_k[has], count = _step_advantages(G[has], codes[has], n_codes, mode, ddof=0)
    sizes[has] = count[codes[has]]
    return A_k, sizes


def _hgpo_advantages(G, A_E, levels, mode, alpha, base_group):
    """HGPO's advantage ``(R,)`` (recipe ``hgpo_advantage_estimate``) and the level sizes ``(R, K + 1)``.

    Items of a row: ``(A_k, (k + 2)^alpha)`` for each level ``k`` it has (``k + 1`` observations in the context),
    and with ``base_group`` the episode item ``(A_E, 1)``. Only items with ``A != 0`` (exactly) count:
    ``A = sum w·A / (sum w + 1e-6)`` over them, 0 when none. A level whose group is a singleton or has equal
    returns thereby drops out instead of pulling the estimate towards 0.
    """
    numerator, denominator = np.zeros(len(G)), np.zeros(len(G))
    items = [(A_E, 1.0)] if base_group else []
    sizes = []
    for k, (codes, n_codes) in enumerate(levels):
        A_k, size_k = _level_advantages(G, codes, n_codes, mode)
        items.append((A_k, (k + 2.0) ** alpha))
        sizes.append(size_k)
    for A_item, weight in items:
        w = np.where(A_item != 0.0, weight, 0.0)
        numerator += w * A_item
        denominator += w
    return numerator / (denominator + WEIGHT_EPS), np.stack(sizes, axis=1)


# --------------------------------------------------------------------------
# public entry point: validate -> codes -> R_tau, G -> A_E, A_S -> combine
# --------------------------------------------------------------------------


def compute_gigpo_advantages(
    rewards: Any,
    group_ids: Any,
    trajectory_ids: Any,
    anchor_states: Sequence[Any] | np.ndarray | torch.Tensor,
    action_valid: Any = None,
    gamma: float = 0.95,
    step_advantage_weight: float = 1.0,
    mode: str = "mean_norm",
    invalid_action_penalty: float = 0.1,
    episode_stats: str = "rows",
    similarity_threshold: float | None = None,
    step_grouping: str = "state",
    hierarchy_depth: int = 2,
    history_keys: Any = None,
    hierarchy_alpha: float = 1.0,
    hierarchy_base_group: bool = False,
) -> AdvantageResult:
    """GiGPO advantages ``A = A_E + omega * A_S`` (or HGPO's) for ``R`` rows (agent turns).

    Parameters
    ----------
    rewards : (R,) float array, tensor or sequence
        Environment reward ``r_t`` of the action taken in each row. Finite.
    group_ids : (R,) hashable
        Task group: the N rollouts of one task (same initial state) share it.
    trajectory_ids : (R,) hashable
        Trajectory of the row. A trajectory is identified by the pair
        ``(group_id, trajectory_id)``, so ids may be reused across groups.
        Rows of one trajectory appear in turn order; trajectories may be
        interleaved with each other.
    anchor_states : (R,) observations
        The raw observation the action was taken from: str, number, tuple,
        list, dict, set, ndarray/tensor (see :func:`_anchor_key` for exact
        matching), or an ``(R, ...)`` numeric array/tensor whose rows are the
        observations.
    action_valid : (R,) bool, optional
        ``False`` rows are penalised by ``invalid_action_penalty``. Default:
        all valid.
    gamma : float in [0, 1]
        Discount of the step return ``G_t``.
    step_advantage_weight : float
        ``omega``; 0 gives GRPO's advantage. Not used by
        ``step_grouping="hierarchical"`` (a ``UserWarning`` if it is not 1).
    mode : {"mean_norm", "mean_std_norm"}
        ``x - mean`` or ``(x - mean) / (std + 1e-6)``, for every level. GiGPO's
        std has Bessel's correction (as ``torch.std``); HGPO's level groups use
        the population std (``ddof=0``), as its authors' recipe does.
    invalid_action_penalty : float
        Subtracted from an invalid row's episode score and step return.
    episode_stats : {"rows", "trajectories"}
        Population of the episode-level statistics of a task group:

        * ``"rows"`` (reference behaviour): one value per row, the row's
          episode score ``R_tau - penalty * (1 - valid)``; a trajectory
          weighs as many times as it has rows.
        * ``"trajectories"``: one value per trajectory, its unpenalised
          ``R_tau`` (GRPO's per-rollout statistics). Each row's ``A_E`` is
          its own (penalised) episode score minus that mean (over std).

        A task group with a single trajectory gets ``A_E = A_S = 0`` on all
        its rows (see Notes).
    similarity_threshold : float in (0, 1), optional
        ``None``: exact anchor matching. Otherwise anchors (which must all be
        ``str``) of one task group share a step group when connected by a
        chain of pairs with ``rapidfuzz.fuzz.ratio(a, b) / 100 >= threshold``
        (normalised Indel similarity ``1 - indel(a, b) / (len a + len b)``);
        the grouping is a transitive closure and independent of row order.
        The pairwise matching loops over task groups in Python.
    step_grouping : {"state", "hierarchical"}
        ``"state"`` (default): GiGPO's step groups (same task group, same
        anchor state). ``"hierarchical"``: HGPO's estimator, see Notes.
    hierarchy_depth : int >= 0
        ``K`` (the recipe's ``history_length``): the longest context of
        ``"hierarchical"`` holds the current and ``K`` previous anchor states
        (ignored for ``"state"``).
    history_keys : ignored
        Deprecated (a ``DeprecationWarning`` when given; removed in the next
        release): HGPO's contexts now come from ``anchor_states`` and the
        turn order alone.
    hierarchy_alpha : float >= 0
        ``alpha`` of the level weights ``(k + 2)^alpha`` (the recipe's
        ``length_weight_alpha``, 1.0 in its scripts; 0 weighs every item
        equally).
    hierarchy_base_group : bool
        The recipe's ``base_group``: add ``A_E`` to a row's HGPO items as
        one more item of weight 1 (default ``False``, as its scripts).

    Returns
    -------
    AdvantageResult
        Per-row fields, see :class:`AdvantageResult`. Empty input gives
        empty fields.

    Notes
    -----
    * ``R_tau = sum_t r_t`` over the trajectory; episode score
      ``R_tau - penalty * (1 - valid)`` of each row; ``A_E`` normalises it
      over the task group (Sec. 3.1).
    * ``G_t = r_t + gamma * G_{t+1}`` from raw rewards (0 after the last
      row), minus the row's own penalty; ``A_S`` normalises it over the step
      group (rows of one task group with the same anchor state, Sec. 3.2).
      A singleton step group gets ``A_S = 0``; equal members give exactly 0.
    * ``step_grouping="hierarchical"`` is HGPO (He, Feng et al., arXiv
      2602.22817) as its authors compute it (OliverLeeXZ/SERL,
      ``recipe/hgpo/core_hgpo.py``, ``hgpo_advantage_estimate``). The
      level-``k`` context of a row at turn ``t`` is its task group plus the
      anchor states of turns ``t-k .. t`` of its own trajectory (no
      actions); it exists only for ``t >= k``, ``k = 0..K`` (level 0 is
      GiGPO's step group). Rows sharing a level-``k`` context (two or more;
      revisits count separately) form a group, within which ``A_k``
      normalises ``G_t`` (population std). A row's items are ``(A_k,
      (k + 2)^alpha)`` for its levels and, with ``hierarchy_base_group``,
      ``(A_E, 1)``. Only items with ``A != 0`` count, ``A = sum w A /
      (sum w + 1e-6)``, 0 when none. That is the final advantage (both
      ``advantages`` and ``step_advantages``): no ``A_E`` added on top, no
      ``omega``. ``episode_advantages`` still reports ``A_E``. ``K = 0``
      without the base item is GiGPO's ``A_S`` (``mean_norm``; times
      ``2^alpha / (2^alpha + 1e-6)``) alone. Differences from the recipe:
      float64 instead of float32 (so a group of equal returns gives exactly
      0 here, where float32 rounding may leave a tiny non-zero item), and
      the lone-trajectory rule below. Cost: one code pairing and one
      segment normalisation per level, no per-row Python loop.
    * A task group with ONE trajectory (in training: the other members'
      environments failed and their rows were dropped) gets ``A_E = 0`` and
      ``A_S = 0`` on every row: a population of one carries no relative
      signal. The reference instead uses mean 0 / std 1 for a singleton
      population, so a lone survivor's advantage would be its raw return
      (and, under ``episode_stats="rows"``, a value that depends on its
      length); there this only arises with ``N = 1``, which the trainer
      rejects (``num_generations >= 2``).

    Raises
    ------
    ValueError
        Mismatched lengths (names the argument), non-1-D or non-finite
        ``rewards``, ``gamma`` outside [0, 1], non-finite
        ``step_advantage_weight`` / ``invalid_action_penalty``, unknown
        ``mode`` or ``episode_stats``, ``similarity_threshold`` outside
        (0, 1), non-boolean ``action_valid``, unknown ``step_grouping``,
        negative ``hierarchy_depth`` or ``hierarchy_alpha``.
    TypeError
        Unhashable ``group_ids`` / ``trajectory_ids`` / ``anchor_states``,
        non-str ``anchor_states`` with a ``similarity_threshold``, non-numeric
        scalar arguments or ``rewards``, non-int ``hierarchy_depth``,
        non-bool ``hierarchy_base_group``.
    """
    s = _validate(rewards, group_ids, trajectory_ids, anchor_states, action_valid, gamma, step_advantage_weight, mode,
                  invalid_action_penalty, episode_stats, similarity_threshold, step_grouping, hierarchy_depth,
                  history_keys, hierarchy_alpha, hierarchy_base_group)
    if len(s.r) == 0:
        empty, ids, levels = np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros((0, s.depth + 1), dtype=np.int64)
        return _package(rewards, empty, empty, empty, empty, ids, empty, ids, (levels, levels))
    c = _row_codes(group_ids, trajectory_ids, anchor_states, s.threshold)  # step 1: codes
    nxt = _next_rows(c.traj)
    row_penalty = s.penalty * (~s.valid)  # step 2: R_tau, G
    R_tau = np.bincount(c.traj, weights=s.r, minlength=c.n_traj)
    episode_returns = R_tau[c.traj]
    G = _discounted_returns(s.r, c.traj, s.gamma, nxt) - row_penalty
    A_E = _episode_advantages(  # step 3: A_E (Sec. 3.1)
        episode_returns - row_penalty, R_tau, c.group, c.traj, c.n_groups, c.n_traj, s.mode, s.episode_stats
    )
    lone = _lone_trajectory_rows(c.group, c.traj, c.n_groups, c.n_traj)
    A_E[lone] = 0.0  # a population of one: nothing to compare against
    if s.step_grouping == "state":  # step 4: A_S (Sec. 3.2), step 5: A (Sec. 3.3)
        A_S, count = _step_advantages(G, c.step, c.n_steps, s.mode)
        A_S[lone] = 0.0
        A, level_ids, level_sizes = A_E + s.omega * A_S, c.step[:, None], count[c.step][:, None]
    else:  # HGPO: the weighted hierarchical step advantage is the final one
        levels = _context_codes(c.step, c.n_steps, _previous_rows(nxt), s.depth)
        A_S, level_sizes = _hgpo_advantages(G, A_E, levels, s.mode, s.alpha, s.base_group)
        A_S[lone] = 0.0
        A, level_ids = A_S, np.stack([codes for codes, _ in levels], axis=1)
    return _package(rewards, A_E, A_S, A, G, c.step, episode_returns, level_sizes[:, 0], (level_ids, level_sizes))


@dataclass
class _Settings:
    """Checked arguments of :func:`compute_gigpo_advantages`."""

    r: np.ndarray
    valid: np.ndarray
    gamma: float
    omega: float
    penalty: float
    mode: str
    episode_stats: str
    threshold: float | None
    step_grouping: str
    depth: int
    alpha: float
    base_group: bool


def _validate(rewards, group_ids, trajectory_ids, anchor_states, action_valid, gamma, step_advantage_weight, mode,
              invalid_action_penalty, episode_stats, similarity_threshold, step_grouping, hierarchy_depth,
              history_keys, hierarchy_alpha, hierarchy_base_group) -> _Settings:
    """Check every argument (errors name the argument and the value) and convert rewards / validity flags."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if episode_stats not in _EPISODE_STATS:
        raise ValueError(f"episode_stats must be one of {_EPISODE_STATS}, got {episode_stats!r}")
    gamma = _as_scalar(gamma, "gamma", 0.0, 1.0)
    omega = _as_scalar(step_advantage_weight, "step_advantage_weight")
    penalty = _as_scalar(invalid_action_penalty, "invalid_action_penalty")
    if similarity_threshold is not None:
        similarity_threshold = _as_scalar(similarity_threshold, "similarity_threshold")
        if not 0.0 < similarity_threshold < 1.0:
            raise ValueError(f"similarity_threshold must be in (0, 1), got {similarity_threshold!r}")
    if step_grouping not in _STEP_GROUPINGS:
        raise ValueError(f"step_grouping must be one of {_STEP_GROUPINGS}, got {step_grouping!r}")
    if isinstance(hierarchy_depth, bool) or not isinstance(hierarchy_depth, (int, np.integer)):
        raise TypeError(f"hierarchy_depth must be an int >= 0, got {type(hierarchy_depth).__name__}")
    if hierarchy_depth < 0:
        raise ValueError(f"hierarchy_depth must be an int >= 0, got {hierarchy_depth!r}")
    alpha = _as_scalar(hierarchy_alpha, "hierarchy_alpha", 0.0)
    if not isinstance(hierarchy_base_group, (bool, np.bool_)):
        raise TypeError(f"hierarchy_base_group must be a bool, got {type(hierarchy_base_group).__name__}")
    if history_keys is not None:
        warnings.warn("history_keys is deprecated and ignored (it will be removed in the next release): HGPO's "
                      "contexts are derived from anchor_states and the turn order", DeprecationWarning, stacklevel=3)
    hierarchical = step_grouping == "hierarchical"
    if hierarchical and omega != 1.0:
        warnings.warn(f"step_advantage_weight={omega} is not used by step_grouping='hierarchical': HGPO's advantage "
                      "is its weighted step advantage alone (the episode advantage enters only as the "
                      "hierarchy_base_group item)", UserWarning, stacklevel=3)
    r = _as_rewards(rewards)
    n = len(r)
    _check_length(group_ids, "group_ids", n)
    _check_length(trajectory_ids, "trajectory_ids", n)
    _check_length(anchor_states, "anchor_states", n)
    return _Settings(r, _as_valid(action_valid, n), gamma, omega, penalty, mode, episode_stats, similarity_threshold,
                     step_grouping, int(hierarchy_depth) if hierarchical else 0, alpha, bool(hierarchy_base_group))


@dataclass
class _RowCodes:
    """Integer codes ``0..n-1`` per row: task group, trajectory (a (group, id) pair), step group (Sec. 3.2)."""

    group: np.ndarray
    n_groups: int
    traj: np.ndarray
    n_traj: int
    step: np.ndarray
    n_steps: int


def _row_codes(group_ids, trajectory_ids, anchor_states, threshold) -> _RowCodes:
    """Step 1: codes of task groups, trajectories and anchor states (exact or fuzzy, never across task groups)."""
    group_codes, n_groups = _factorize(group_ids, "group_ids")
    traj_in_group, n_traj_ids = _factorize(trajectory_ids, "trajectory_ids")
    traj_codes, n_traj = _pair_codes(group_codes, traj_in_group, n_traj_ids)
    if threshold is None:
        anchor_codes, n_anchors = _exact_anchor_codes(anchor_states)
        step_codes, n_steps = _pair_codes(group_codes, anchor_codes, n_anchors)
    else:
        step_codes, n_steps = _dense_codes(_similar_anchor_codes(anchor_states, group_codes, threshold))
    return _RowCodes(group_codes, n_groups, traj_codes, n_traj, step_codes, n_steps)


def _package(rewards, A_E, A_S, A, G, step_codes, episode_returns, sizes, levels=(None, None)) -> AdvantageResult:
    """Wrap outputs as numpy float64 or torch tensors matching ``rewards``."""
    floats = (A_E, A_S, A, G, episode_returns)
    if isinstance(rewards, torch.Tensor):
        dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
        dev = rewards.device
        floats = tuple(torch.from_numpy(np.ascontiguousarray(f)).to(device=dev, dtype=dtype) for f in floats)
        step_codes, sizes = (torch.from_numpy(np.asarray(v, dtype=np.int64)).to(dev) for v in (step_codes, sizes))
        levels = tuple(None if v is None else torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)).to(dev)
                       for v in levels)
    else:
        step_codes, sizes = np.asarray(step_codes, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    A_E, A_S, A, G, episode_returns = floats
    return AdvantageResult(
        episode_advantages=A_E,
        step_advantages=A_S,
        advantages=A,
        step_returns=G,
        anchor_group_ids=step_codes,
        episode_returns=episode_returns,
        anchor_group_sizes=sizes,
        level_group_ids=levels[0],
        level_group_sizes=levels[1],
    )

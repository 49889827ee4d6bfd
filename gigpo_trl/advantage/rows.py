"""What the estimator reads of each row: checked inputs, integer codes, turn order.

Step 1 of every estimator: the task group, trajectory and anchor state of each row become integer codes
``0..U-1`` (exact matching of raw observations, see :func:`anchor_key`), and the rows of each trajectory are
linked in turn order. Everything downstream is segment arithmetic on these codes.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import math
from typing import Any

import numpy as np
import torch

#: Anchor element types used as dictionary keys without conversion.
_PLAIN_TYPES = frozenset({str, int, float, bool, bytes, complex, type(None)})


# --------------------------------------------------------------------------
# input validation and conversion
# --------------------------------------------------------------------------

def to_numpy(x: Any) -> Any:
    """Torch tensors become numpy arrays (bfloat16 via float32); rest as is."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return x


def check_length(x: Any, name: str, n: int) -> None:
    try:
        m = len(x)
    except TypeError:
        raise TypeError(f"{name} must be a sequence, array or tensor of length {n}, got {type(x).__name__}") from None
    if m != n:
        raise ValueError(f"{name} has length {m} but rewards has length {n}")


def as_rewards(rewards: Any) -> np.ndarray:
    arr = to_numpy(rewards)
    try:
        arr = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError("rewards must contain real numbers") from None
    if arr.ndim != 1:
        raise ValueError(f"rewards must be 1-D of shape (R,), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("rewards must be finite (found NaN or inf)")
    return arr


def as_valid(action_valid: Any, n: int) -> np.ndarray:
    if action_valid is None:
        return np.ones(n, dtype=bool)
    check_length(action_valid, "action_valid", n)
    arr = np.asarray(to_numpy(action_valid))
    if arr.ndim != 1:
        raise ValueError(f"action_valid must be 1-D of shape (R,), got shape {arr.shape}")
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind in "iuf" and np.isin(arr, (0, 1)).all():
        return arr.astype(bool)
    raise ValueError("action_valid must be boolean (or 0/1)")


def as_scalar(value: Any, name: str, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not (math.isfinite(v) and low <= v <= high):
        raise ValueError(f"{name} must be finite and in [{low}, {high}], got {value!r}")
    return v


# --------------------------------------------------------------------------
# step 1: integer codes for task groups, trajectories and anchor states
# --------------------------------------------------------------------------


def factorize_hashables(seq: list, name: str) -> tuple[np.ndarray, list]:
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


def dense_codes(keys: np.ndarray) -> tuple[np.ndarray, int]:
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


def factorize(values: Any, name: str) -> tuple[np.ndarray, int]:
    """Integer codes ``0..U-1`` and ``U`` of an ``(R,)`` array/tensor/sequence of ids."""
    values = to_numpy(values)
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.ndim != 1:
            raise ValueError(f"{name} must be 1-D of shape (R,), got shape {values.shape}")
        if values.dtype.kind in "iub":
            return dense_codes(values.astype(np.int64) - int(values.min()))
        uniq, inverse = np.unique(values, return_inverse=True)
        return inverse.astype(np.int64, copy=False), len(uniq)
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    codes, uniques = factorize_hashables(seq, name)
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


def anchor_key(x: Any) -> Any:
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
        x = to_numpy(x)
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return (_NDARRAY, x.shape, "O", tuple(map(anchor_key, x.ravel().tolist())))
        if x.dtype.kind in "fc":
            x = _canonical_floats(x)
        return (_NDARRAY, x.shape, x.dtype.str, np.ascontiguousarray(x).tobytes())
    if isinstance(x, tuple):
        return tuple(map(anchor_key, x))
    if isinstance(x, list):
        return (_LIST, tuple(map(anchor_key, x)))
    if isinstance(x, dict):
        return (_DICT, frozenset((anchor_key(k), anchor_key(v)) for k, v in x.items()))
    if isinstance(x, (set, frozenset)):
        return (_SET, frozenset(map(anchor_key, x)))
    try:
        hash(x)
    except TypeError:
        raise TypeError(f"unhashable anchor of type {tx.__name__}") from None
    return x


def anchor_digest(x: Any) -> str | None:
    """A short label of an anchor state that is equal exactly when :func:`anchor_key` is: the first 16 hex digits
    of the BLAKE2b hash of a canonical text of the key (``None`` for ``None``).

    The text is the same in every process (sets and dicts are sorted by their members' text, numbers that compare
    equal are written alike: ``1``, ``1.0`` and ``True``), so labels written by different processes or runs match.
    An object of another hashable type is written by its ``repr``.
    """
    if x is None:
        return None
    text = _canonical_text(anchor_key(x))
    return hashlib.blake2b(text.encode("utf-8", "backslashreplace"), digest_size=8).hexdigest()


def _canonical_text(k: Any) -> str:
    """The text of one :func:`anchor_key` result (see :func:`anchor_digest`)."""
    if isinstance(k, str):
        return "s" + repr(str(k))
    if isinstance(k, bytes):
        return "b" + k.hex()
    if isinstance(k, _Tag):
        return f"<{k.name}>"
    if isinstance(k, tuple):
        return "(" + ",".join(map(_canonical_text, k)) + ")"
    if isinstance(k, frozenset):
        return "{" + ",".join(sorted(map(_canonical_text, k))) + "}"
    if isinstance(k, (bool, int, np.integer)):
        return f"n{int(k)}"
    if isinstance(k, (float, np.floating)):
        v = float(k)
        return f"n{int(v)}" if math.isfinite(v) and v.is_integer() else f"n{v!r}"
    if isinstance(k, (complex, np.complexfloating)):
        return _canonical_text(k.real) if k.imag == 0 else f"c({_canonical_text(k.real)},{_canonical_text(k.imag)})"
    return "o" + repr(k)


def exact_anchor_codes(anchor_states: Any) -> tuple[np.ndarray, int]:
    """Codes ``0..U-1`` and ``U`` of the anchors under exact matching (see :func:`anchor_key`)."""
    anchors = to_numpy(anchor_states)
    if isinstance(anchors, np.ndarray) and anchors.dtype != object:
        if anchors.ndim == 1:  # numbers or fixed-width strings
            return factorize(anchors, "anchor_states")
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
            seq = list(map(anchor_key, seq))
        except TypeError as err:
            raise TypeError(f"anchor_states: {err}") from None
    codes, uniques = factorize_hashables(seq, "anchor_states")
    return codes, len(uniques)


def joint_anchor_codes(anchor_states: Any, next_anchor_states: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes of two ``(R,)`` sequences of anchors in one code space (a state reached is the state left).

    Returns ``(anchor_codes, next_codes, U)``; matching as in :func:`exact_anchor_codes`.
    """
    a, b = to_numpy(anchor_states), to_numpy(next_anchor_states)
    n = len(a)
    if (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype.kind == b.dtype.kind != "O"
            and a.shape[1:] == b.shape[1:]):
        both = np.concatenate([a, b])
    else:
        both = [*a, *b]
    codes, n_codes = exact_anchor_codes(both)
    return codes[:n], codes[n:], n_codes


def pair_codes(outer: np.ndarray, inner: np.ndarray, n_inner: int) -> tuple[np.ndarray, int]:
    """Codes of the ``(outer, inner)`` pairs, e.g. (task group, anchor) or (task group, trajectory).

    If every inner code occurs with one outer code only (the usual case), the
    inner codes already are the pair codes (linear time check).
    """
    outer_of_inner = np.empty(n_inner, dtype=np.int64)
    outer_of_inner[inner] = outer
    if np.array_equal(outer_of_inner[inner], outer):
        return inner, n_inner
    return dense_codes(outer * n_inner + inner)



# --------------------------------------------------------------------------
# turn order within a trajectory
# --------------------------------------------------------------------------


def _max_code(codes: np.ndarray) -> int:
    return int(codes.max()) if len(codes) else 0


def turn_order(traj_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of each trajectory in input (turn) order; other trajectories may be interleaved.

    Returns ``(nxt, turn)``: ``nxt`` ``(R + 1,)`` int, the next row of each row's trajectory, ``R`` after its
    last row (index ``R`` is a sentinel pointing at itself); ``turn`` ``(R,)`` int, the row's turn ``t``
    (0 at the trajectory's first row).
    """
    n = len(traj_codes)
    if n < 2 or bool((traj_codes[1:] >= traj_codes[:-1]).all()):  # already grouped: no sort
        order = np.arange(n)
    else:
        small = traj_codes.astype(np.uint16) if _max_code(traj_codes) <= np.iinfo(np.uint16).max else traj_codes
        order = np.argsort(small, kind="stable")  # radix sort for uint16
    same = traj_codes[order[1:]] == traj_codes[order[:-1]]
    nxt = np.full(n + 1, n, dtype=np.int64)
    nxt[order[:-1][same]] = order[1:][same]
    starts = np.flatnonzero(np.concatenate(([True], ~same))) if n else np.zeros(0, dtype=np.int64)
    turn = np.empty(n, dtype=np.int64)
    turn[order] = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
    return nxt, turn


def previous_rows(nxt: np.ndarray) -> np.ndarray:
    """``(R + 1,)`` int: the previous row of each row's trajectory, ``R`` (the sentinel) at its first row."""
    n = len(nxt) - 1
    prev = np.full(n + 1, n, dtype=np.int64)
    linked = np.flatnonzero(nxt[:n] < n)
    prev[nxt[linked]] = linked
    return prev

"""Similarity anchors: anchor texts of one task group that are near-duplicates share a step group.

An option of GiGPO's step level (``similarity_threshold``; the reference offers difflib clustering with a
first-fit, row-order-dependent result). Here: the connected components of the "at least ``threshold``
similar" graph (normalised Indel similarity, rapidfuzz), so the grouping is a transitive closure independent
of row order. Distinct pairs are pruned by an exact upper bound from character-bigram counts before rapidfuzz
scores them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rapidfuzz.distance import Indel

from .rows import dense_codes, factorize_hashables, to_numpy

#: Buckets of the hashed character-bigram profiles used to prune fuzzy pairs.
_BIGRAM_BUCKETS = 2048


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


def similar_anchor_codes(anchor_states: Any, group_codes: np.ndarray, threshold: float) -> np.ndarray:
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
    anchors = to_numpy(anchor_states)
    seq = anchors.tolist() if isinstance(anchors, np.ndarray) else list(anchors)
    bad = [t for t in set(map(type, seq)) if not issubclass(t, str)]
    if bad:
        raise TypeError(
            f"anchor_states must contain only str when similarity_threshold is set, found {bad[0].__name__}"
        )
    text_codes, texts = factorize_hashables(seq, "anchor_states")
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

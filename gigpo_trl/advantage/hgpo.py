"""HGPO (He, Feng et al., *Hierarchy-of-Groups Policy Optimization for Long-Horizon Agentic Tasks*, arXiv
2602.22817), as its authors' recipe computes it (OliverLeeXZ/SERL, ``hgpo_advantage_estimate``).

Rows that share their task group and the anchor states of their last ``k + 1`` turns form the level-``k``
group (:func:`history_contexts`; level 0 is GiGPO's step group). Each level normalises the step return ``G_t``
within its groups (:func:`level_advantages`), and a row's advantage is the weighted mean of its non-zero
level advantages (:func:`hierarchical_advantages`). That is the final advantage: no ``A_E`` added on top.
"""

from __future__ import annotations

import numpy as np

from .gigpo import step_relative_advantages
from .options import WEIGHT_EPS
from .rows import dense_codes


def history_contexts(step_codes: np.ndarray, n_steps: int, prev: np.ndarray, depth: int) -> list:
    """The level-``k`` group codes of every row, ``k = 0..depth`` (``K``, the recipe's ``history_length``).

    The level-``k`` context of a row at turn ``t`` is its task group and the anchor states of turns
    ``t - k .. t`` of its own trajectory (``k + 1`` observations, no actions); it exists only for ``t >= k``.
    Built one level at a time, ``c_k = code(c_{k-1}, step code of the row k turns back)``, so the groups nest
    (``G_0 ⊇ G_1 ⊇ …``) and revisits by one trajectory stay separate members. ``prev`` from
    :func:`~gigpo_trl.advantage.rows.previous_rows`. Returns ``[(codes_k, n_k)]``, ``codes_k`` ``(R,)`` with
    ``-1`` where the row has no level ``k``.
    """
    n = len(step_codes)
    levels = [(step_codes, n_steps)]
    codes, back = step_codes, prev[:n]
    for _ in range(depth):
        has = back < n  # the row has k earlier turns (and hence a level k - 1 context)
        new = np.full(n, -1, dtype=np.int64)
        new[has], n_codes = dense_codes(codes[has] * n_steps + step_codes[back[has]])
        levels.append((new, n_codes))
        codes, back = new, prev[back]
    return levels


def level_advantages(G: np.ndarray, codes: np.ndarray, n_codes: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """``A_k`` ``(R,)``: ``G_t`` normalised within the level-``k`` groups, and the group sizes ``(R,)`` int.

    Both 0 where the row has no level ``k`` (``codes == -1``) or is alone in its group. Population std
    (``ddof=0``) plus ``STD_EPS`` in ``mean_std_norm``, as the recipe computes it.
    """
    has = codes >= 0
    A_k, sizes = np.zeros(len(G)), np.zeros(len(G), dtype=np.int64)
    A_k[has], count = step_relative_advantages(G[has], codes[has], n_codes, mode, ddof=0)
    sizes[has] = count[codes[has]]
    return A_k, sizes


def hierarchical_advantages(G, A_E, levels, mode, alpha, base_group) -> tuple[np.ndarray, np.ndarray]:
    """HGPO's advantage ``A = sum_i w_i A_i / (sum_i w_i + WEIGHT_EPS)`` ``(R,)`` and the level sizes ``(R, K + 1)``.

    The items of a row are ``(A_k, (k + 2)^alpha)`` for each level ``k`` it has (``k + 1`` observations in
    the context) and, with ``base_group``, the episode item ``(A_E, 1)``. Only items with ``A_i != 0``
    (exactly) count, so a level whose group is a singleton or holds equal returns drops out instead of
    pulling the estimate towards 0; no item leaves 0.
    """
    numerator, denominator = np.zeros(len(G)), np.zeros(len(G))
    items = [(A_E, 1.0)] if base_group else []
    sizes = []
    for k, (codes, n_codes) in enumerate(levels):
        A_k, size_k = level_advantages(G, codes, n_codes, mode)
        items.append((A_k, (k + 2.0) ** alpha))
        sizes.append(size_k)
    for A_i, weight in items:
        w = np.where(A_i != 0.0, weight, 0.0)
        numerator += w * A_i
        denominator += w
    return numerator / (denominator + WEIGHT_EPS), np.stack(sizes, axis=1)

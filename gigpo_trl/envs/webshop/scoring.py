"""WebShop's purchase score for the project's catalog (``protocol="gigpo-trl"``).

Reward (on ``click[buy now]``, which ends the episode)
-----------------------------------------------------
``score = r_type * (n_attr + n_opt + r_price) / (len(goal attributes) + len(goal options) + 1)`` where

- ``n_attr``: goal attributes the product has. A goal attribute matches when, after normalisation
  (lowercase, non-alphanumerics to spaces), it equals one of the product's attributes, or
  ``rapidfuzz.fuzz.token_sort_ratio`` with one of them is >= 85 (word order and small spelling
  differences, e.g. "water-resistant"/"resistant water"), or it occurs as a whole phrase in the product's
  title, features or description (as WebShop falls back to the product text).
- ``n_opt``: goal options equal (after the same normalisation) to one of the options *selected* when
  buying; options not selected count as unmatched.
- ``r_price``: 1 if the product's price <= the goal's price cap, else 0.
- ``r_type``: 1.0 if the product's type equals the goal's (or their full category paths are equal);
  0.5 if they only share the top-level category (e.g. shampoo bought for a lipstick goal, both "Beauty &
  Personal Care"); 0.1 otherwise.

The env reward is 10.0 when ``score == 1.0`` else 0.0; ``info["task_score"]`` holds the score and
``info["won"]`` is ``score == 1.0``.
"""

from __future__ import annotations

import math
import re
from typing import Any

ATTR_FUZZ_THRESHOLD = 85
TYPE_FACTOR_SAME_TOP = 0.5
TYPE_FACTOR_OTHER = 0.1


def normalize(text: str) -> str:
    """Lowercase, non-alphanumerics to spaces, collapse whitespace."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", str(text).lower()).split())


def _phrase_in(needle: str, hay: str) -> bool:
    return bool(needle) and re.search(r"(?<![0-9a-z])" + re.escape(needle) + r"(?![0-9a-z])", hay) is not None


def attribute_matched(goal_attr: str, product: dict) -> bool:
    """Whether ``product`` has ``goal_attr`` (exact, fuzzy or phrase-in-text match; see module doc)."""
    from rapidfuzz import fuzz

    g = normalize(goal_attr)
    if not g:
        return False
    for p_attr in product.get("attributes", []):
        p = normalize(p_attr)
        if p == g or fuzz.token_sort_ratio(g, p) >= ATTR_FUZZ_THRESHOLD:
            return True
    text = normalize(" ".join([product.get("title", ""), product.get("description", ""),
                               *product.get("features", [])]))
    return _phrase_in(g, text)


def type_factor(goal: dict, product: dict) -> float:
    """1.0 same product type (or same full category path), 0.5 same top-level category, else 0.1."""
    if normalize(goal.get("product_type", "")) == normalize(product.get("product_type", "")):
        return 1.0
    g_cat, p_cat = normalize(goal.get("category", "")), normalize(product.get("category", ""))
    if g_cat and g_cat == p_cat:
        return 1.0
    g_top, p_top = normalize(goal.get("top", "")), normalize(product.get("top", ""))
    if g_top and g_top == p_top:
        return TYPE_FACTOR_SAME_TOP
    return TYPE_FACTOR_OTHER


def webshop_score(goal: dict, product: dict, selected_options: dict | list | None) -> float:
    """WebShop-style purchase score in [0, 1] (module doc). ``goal``: ``attributes`` (list),
    ``options`` (list of values or dict group -> value), ``price_upper``, ``product_type``, optional
    ``category``/``top``. ``product``: ``attributes``, ``price``, ``product_type``, ``category``, ``top``,
    ``title``/``description``/``features``. ``selected_options``: dict group -> value (or list of values)."""
    goal_attrs = list(goal.get("attributes") or [])
    goal_opts = _option_values(goal.get("options"))
    selected = {normalize(v) for v in _option_values(selected_options)}
    n_attr = sum(attribute_matched(a, product) for a in goal_attrs)
    n_opt = sum(normalize(o) in selected for o in goal_opts)
    price_ok = float(product.get("price", math.inf)) <= float(goal.get("price_upper", math.inf))
    raw = (n_attr + n_opt + int(price_ok)) / (len(goal_attrs) + len(goal_opts) + 1)
    return raw * type_factor(goal, product)


def _option_values(options: Any) -> list[str]:
    if not options:
        return []
    if isinstance(options, dict):
        return [str(v) for v in options.values()]
    return [str(v) for v in options]


__all__ = ["ATTR_FUZZ_THRESHOLD", "TYPE_FACTOR_OTHER", "TYPE_FACTOR_SAME_TOP", "attribute_matched", "normalize",
           "type_factor", "webshop_score"]

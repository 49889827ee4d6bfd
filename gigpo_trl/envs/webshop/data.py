"""WebShop data: the bundled catalog and the real WebShop files, as ``(products, splits)``.

Data
----
``WebShopEnv()`` uses the bundled catalog (``gigpo_trl/data/webshop``, made by
``scripts/make_webshop_catalog.py``: 630 products of 14 types, 1000 train / 200 eval goals).
``WebShopEnv(data_dir=...)`` or the ``WEBSHOP_DATA`` environment variable loads the real WebShop files
(``items_shuffle_1000.json`` + ``items_ins_v2_1000.json``, or with ``variant="full"``
``items_shuffle.json`` + ``items_ins_v2.json``); see ``load_webshop_dir`` for how goals are built.
``data_dir="bundled"`` forces the bundled data. Products, goals and the BM25 index are cached per data
source at module level, so all env instances of a process share them.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import zlib
from pathlib import Path
from typing import Any

from .scoring import _option_values, normalize

BUNDLED_DIR = Path(__file__).resolve().parent.parent.parent / "data" / "webshop"
_PRICE_CLAUSE = re.compile(r",?\s*(and\s+)?price\s+lower\s+than\s+[\d.,]+\s+dollars", re.I)


def _read_json(path: Path, expected: str) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"WebShop data file not found: {path} (expected {expected})")
    try:
        if path.suffix == ".gz":
            return json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"WebShop data file {path} is not valid JSON ({e}); expected {expected}") from None


def _with_top(product: dict) -> dict:
    cat = product.get("category", "")
    product.setdefault("top", cat.split("›")[0].strip() if cat else "")
    return product


def load_bundled(data_dir: str | Path = BUNDLED_DIR) -> tuple[list[dict], dict[str, list[dict]]]:
    """Load the bundled catalog (``catalog.json.gz``, ``goals.json.gz``) as ``(products, splits)``."""
    data_dir = Path(data_dir)
    cat = _read_json(data_dir / "catalog.json.gz", 'a gzipped JSON object {"products": [...]}; '
                     "regenerate it with scripts/make_webshop_catalog.py")
    goals = _read_json(data_dir / "goals.json.gz", 'a gzipped JSON object {"train": [...], "eval": [...]}; '
                       "regenerate it with scripts/make_webshop_catalog.py")
    if not isinstance(cat, dict) or not isinstance(cat.get("products"), list):
        raise ValueError(f"{data_dir / 'catalog.json.gz'}: expected a JSON object with a 'products' list")
    if not isinstance(goals, dict) or not all(isinstance(goals.get(s), list) for s in ("train", "eval")):
        raise ValueError(f"{data_dir / 'goals.json.gz'}: expected a JSON object with 'train' and 'eval' "
                         "lists")
    products = [_with_top(dict(p)) for p in cat["products"]]
    by_asin = {p["asin"]: p for p in products}
    splits = {}
    for split in ("train", "eval"):
        out = []
        for g in goals[split]:
            target = by_asin[g["asin"]]
            out.append({**g, "options": list(g["options"].values()), "option_groups": dict(g["options"]),
                        "category": target["category"],
                        "top": target["top"], "task_type": g["product_type"]})
        splits[split] = out
    return products, splits


_PRODUCTS_EXPECTED = (
    "a JSON list of WebShop products, each a dict with 'asin', 'name', 'pricing' (e.g. '$12.99' or "
    "'$10.99 - $15.99'), 'product_category', 'category', 'query', 'customization_options' (option type -> "
    "list of {'value': ...}), 'small_description' and 'full_description'"
)
_INS_EXPECTED = (
    "a JSON object mapping asin -> {'instruction': str, 'instruction_attributes': [str], "
    "'instruction_options': [str] or {type: value}, optionally 'attributes': [str]}"
)


def _parse_price(pricing: Any) -> float:
    if pricing is None or pricing == "" or pricing == []:
        return 100.0
    if isinstance(pricing, (int, float)):
        return float(pricing)
    if isinstance(pricing, list):
        return float(min(float(x) for x in pricing))
    nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", str(pricing).replace(",", ""))]
    return min(nums) if nums else 100.0


def _as_text_list(x: Any) -> list[str]:
    if not x:
        return []
    if isinstance(x, str):
        return [x]
    return [str(v) for v in x if v]


def _real_product(raw: Any, path: Path, ins: dict) -> dict:
    if not isinstance(raw, dict) or not raw.get("asin"):
        raise ValueError(f"{path}: every entry must be a product dict with an 'asin'; "
                         f"expected {_PRODUCTS_EXPECTED}")
    asin = str(raw["asin"]).strip().upper()
    options: dict[str, list[str]] = {}
    custom = raw.get("customization_options") or {}
    if not isinstance(custom, dict):
        raise ValueError(f"{path}: product {asin} has customization_options of type {type(custom).__name__}; "
                         "expected a dict option type -> list of {'value': ...}")
    for group, values in custom.items():
        vals = []
        for v in values or []:
            val = v.get("value") if isinstance(v, dict) else v
            if val is not None and str(val).strip() and str(val).strip().lower() not in vals:
                vals.append(str(val).strip().lower())
        if vals:
            options[str(group).strip().lower()] = vals
    path_cat = str(raw.get("product_category") or "")
    segs = [s.strip() for s in path_cat.split("›") if s.strip()]
    ptype = str(raw.get("query") or (segs[-1] if segs else "") or raw.get("category") or "").strip().lower()
    entry = ins.get(asin) or ins.get(raw["asin"]) or {}
    attrs = entry.get("attributes") or entry.get("instruction_attributes") or raw.get("attributes") or []
    return {
        "asin": asin,
        "title": str(raw.get("name") or raw.get("Title") or "").strip(),
        "product_type": ptype,
        "category": path_cat,
        "top": str(raw.get("category") or (segs[0] if segs else "")).strip().lower(),
        "coarse": str(raw.get("category") or (segs[0] if segs else "other")).strip().lower(),
        "price": _parse_price(raw.get("pricing")),
        "attributes": [str(a) for a in attrs if isinstance(a, str)],
        "options": options,
        "description": " ".join(_as_text_list(raw.get("full_description"))),
        "features": _as_text_list(raw.get("small_description")),
        "rating": raw.get("average_rating") if isinstance(raw.get("average_rating"), (int, float)) else None,
    }


def goal_spec(goal: dict, price: bool = True) -> tuple:
    """What a goal's reward depends on (see the module doc): normalised product type, the sorted normalised
    attributes and option values and, with ``price``, the price cap. Two goals with one spec are one task, however
    their instructions are worded."""
    spec = (normalize(goal.get("product_type", "")), tuple(sorted(normalize(a) for a in goal.get("attributes") or [])),
            tuple(sorted(normalize(o) for o in _option_values(goal.get("options")))))
    return (*spec, float(goal.get("price_upper", math.inf))) if price else spec


def _split_goals(goals: list[dict], n_eval: int) -> tuple[list[dict], list[dict]]:
    """``(train, eval)`` of shuffled ``goals``: one goal per :func:`goal_spec` (first kept), and goals that share
    the spec without the price cap, or the instruction text without its price clause, in one split only (the
    first ``n_eval`` such groups in order form eval), so no eval goal has a reworded or re-priced copy in train."""
    seen, train, evals, eval_keys, train_keys = set(), [], [], set(), set()
    for g in goals:
        if goal_spec(g) in seen:
            continue
        seen.add(goal_spec(g))
        keys = {goal_spec(g, price=False), normalize(_PRICE_CLAUSE.sub("", g["instruction"]))}
        if keys & eval_keys or (not keys & train_keys and len(evals) < n_eval):
            evals.append(g)
            eval_keys |= keys
        else:
            train.append(g)
            train_keys |= keys
    # a goal linked to eval only through a later goal: out of train too
    train = [g for g in train if not {goal_spec(g, price=False),
                                      normalize(_PRICE_CLAUSE.sub("", g["instruction"]))} & eval_keys]
    return train, evals


def load_webshop_dir(data_dir: str | Path, variant: str = "1000") -> tuple[list[dict], dict[str, list[dict]]]:
    """Load the real WebShop files from ``data_dir`` as ``(products, splits)``.

    ``variant="1000"`` reads ``items_shuffle_1000.json`` and ``items_ins_v2_1000.json``; ``"full"`` reads
    ``items_shuffle.json`` and ``items_ins_v2.json``. A goal is made from every product whose
    ``items_ins_v2`` entry has a non-empty ``instruction``: attributes ``instruction_attributes``, options
    ``instruction_options`` (list, or dict type -> value), product type/category those of the product.
    The price cap is one of the first three multiples of 10 above the product's price, chosen by
    ``crc32(asin) % 3`` (deterministic), and ", and price lower than X dollars" is appended, unless
    the instruction already states such a price, which is then the cap. Goals are shuffled with
    ``random.Random(233)`` and deduplicated on their :func:`goal_spec` (type, attributes, options, price cap);
    about the first 20% (at most 500, at least 1) are the eval split, the rest train, where goals with one spec
    apart from the price cap, or one instruction apart from its price clause, always share a split (no
    near-duplicate of an eval goal is trained on). ``task_type`` is the product's coarse ``category`` (beauty,
    food, ...).

    Raises:
        FileNotFoundError: a file is missing (the message names it and the expected content).
        ValueError: a file is malformed, or no goal could be built.
    """
    if variant not in ("1000", "full"):
        raise ValueError(f"unknown WebShop data variant {variant!r}; use '1000' or 'full'")
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"WebShop data directory not found: {data_dir} (expected a directory with "
                                "items_shuffle_1000.json and items_ins_v2_1000.json)")
    suffix = "_1000" if variant == "1000" else ""
    prod_path = data_dir / f"items_shuffle{suffix}.json"
    ins_path = data_dir / f"items_ins_v2{suffix}.json"
    missing = [(f, e) for f, e in ((prod_path, _PRODUCTS_EXPECTED), (ins_path, _INS_EXPECTED)) if not f.is_file()]
    if len(missing) > 1:  # name every missing file in one message (one missing file: _read_json says so)
        raise FileNotFoundError("WebShop data files not found: " + "; ".join(f"{f} (expected {e})" for f, e in missing))
    raw_products = _read_json(prod_path, _PRODUCTS_EXPECTED)
    ins = _read_json(ins_path, _INS_EXPECTED)
    if not isinstance(raw_products, list):
        raise ValueError(f"{prod_path}: top level is a {type(raw_products).__name__}; "
                         f"expected {_PRODUCTS_EXPECTED}")
    if not isinstance(ins, dict) or not all(isinstance(v, dict) for v in ins.values()):
        raise ValueError(f"{ins_path}: expected {_INS_EXPECTED}")
    ins = {str(k).strip().upper(): v for k, v in ins.items()}
    products, seen = [], set()
    for raw in raw_products:
        p = _real_product(raw, prod_path, ins)
        if p["asin"] not in seen:
            seen.add(p["asin"])
            products.append(p)
    goals = []
    for p in products:
        entry = ins.get(p["asin"])
        if not entry or not str(entry.get("instruction") or "").strip():
            continue
        instruction = " ".join(str(entry["instruction"]).split())
        opts = entry.get("instruction_options") or []
        opts = list(opts.values()) if isinstance(opts, dict) else list(opts)
        opts = [str(o).strip().lower() for o in opts if str(o).strip()]
        stated = _PRICE_CLAUSE.search(instruction)
        if stated:
            price_upper = float(re.findall(r"\d+(?:\.\d+)?", stated.group(0).replace(",", ""))[-1])
        elif p["price"] < 990:
            multiples = [10.0 * (math.floor(p["price"] / 10) + j) for j in (1, 2, 3)]
            price_upper = multiples[zlib.crc32(p["asin"].encode()) % 3]
            instruction = f"{instruction.rstrip('.')}, and price lower than {price_upper:.2f} dollars"
        else:
            price_upper = 1e6
        goals.append({
            "asin": p["asin"], "product_type": p["product_type"], "category": p["category"], "top": p["top"],
            "instruction": instruction,
            "attributes": [str(a) for a in entry.get("instruction_attributes") or []],
            "options": opts, "price_upper": price_upper, "task_type": p["coarse"],
        })
    if not goals:
        raise ValueError(f"{ins_path}: no product of {prod_path.name} has an instruction; "
                         f"expected {_INS_EXPECTED}")
    random.Random(233).shuffle(goals)
    train_goals, eval_goals = _split_goals(goals, n_eval=max(1, min(500, round(0.2 * len(goals)))))
    splits = {}
    for split, gs in (("train", train_goals), ("eval", eval_goals)):
        splits[split] = [{"id": f"{split}-{i:04d}", **g} for i, g in enumerate(gs)]
    return products, splits


__all__ = ["BUNDLED_DIR", "goal_spec", "load_bundled", "load_webshop_dir"]

"""WebShop (Yao et al., 2022) as a text environment, in the spirit of its "simple" text mode.

This module doc describes ``protocol="gigpo-trl"`` (the default). ``WebShopEnv(protocol="verl-agent")`` returns a
:class:`PaperWebShopEnv`: the GiGPO paper's goals, reward (:func:`paper_reward`), pages, actions and search, as its
code runs them (see :mod:`gigpo_trl.envs.webshop_paper` and README "Reproducing the paper").

Pages and actions
-----------------
The agent shops on four kinds of pages, rendered as text with ``[SEP]`` separators; every page starts
with ``WebShop [SEP] Instruction: [SEP] <instruction> [SEP]``:

- search page: ``... [SEP] Search``; the only action is ``search[<query>]``.
- results page: ``Back to Search [SEP] Page 2 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP]
  B0... [SEP] <title> [SEP] $12.99 [SEP] ...``; 10 results per page out of the top 50 of a BM25 search.
- item page: ``Back to Search [SEP] < Prev [SEP] <group> [SEP] <value> [SEP] ... [SEP] <title> [SEP]
  Price: $x [SEP] Rating: y [SEP] Description [SEP] Features [SEP] Buy Now``; once options are chosen a
  ``Selected options: size: large, color: red`` segment follows the option groups.
- description / features sub-pages: ``Back to Search [SEP] < Prev [SEP] <text>``.

Actions are ``search[query]`` and ``click[x]`` where ``x`` is one of the page's clickables: ``back to
search``, ``next >``, ``< prev`` (to the previous results page, from an item back to the results, from a
sub-page back to the item), a product id on the current results page, an option value, ``description``,
``features``, ``buy now``. ``info["admissible_actions"]`` lists ``search[<your query>]`` when the search
bar is shown, else ``click[...]`` for every clickable, lowercase as in WebShop. Matching ignores case and
extra whitespace (``click[ Next> ]`` works). Anything else (unknown verb, malformed text, a click on
something not on the page, an empty search, ``WebShopEnv.invalid_action``) is invalid: the observation is
unchanged, the reward 0, the episode goes on and ``info["action_valid"]`` is ``False``.

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
import os
import random
import re
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from . import webshop_paper as paper
from .base import TextEnv, check_protocol, init_protocol
from .webshop_paper import paper_reward  # noqa: F401  (public: gigpo_trl.envs.webshop.paper_reward)

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "data" / "webshop"
RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
ATTR_FUZZ_THRESHOLD = 85
TYPE_FACTOR_SAME_TOP = 0.5
TYPE_FACTOR_OTHER = 0.1
SUCCESS_REWARD = 10.0
SEARCH_PLACEHOLDER = "search[<your query>]"

SYSTEM_PROMPT = (
    "You are a shopping assistant browsing WebShop, a text version of an online store. Each turn you see "
    "the current page, where items are separated by [SEP]. Act with exactly one of: search[your query] "
    "(only when the page has a Search bar) or click[item], where item is something clickable on the page: "
    "a product id, an option value such as a size or color, 'next >', '< prev', 'back to search', "
    "'description', 'features' or 'buy now'. First think inside <think> </think>, then put your single "
    "action inside <action> </action>."
)

PROMPT_TEMPLATE = (
    "Shopping task: {instruction}\n"
    "{history}"
    "Step {turn} of at most {max_turns}. Current page:\n{observation}\n"
    "{admissible_actions}"
    "Find a product that satisfies every requirement of the task, click each requested option, then "
    "click[buy now]. Reason inside <think> </think>, then answer with one action inside <action> </action>, "
    "for example <action>search[waterproof hiking boots]</action> or <action>click[buy now]</action>."
)

# Our wording of the paper's two WebShop templates (same structure as verl-agent prompts/webshop.py: task, steps
# taken, history block, current step, page, the bracketed admissible list one action a line; placeholders in
# gigpo_trl.prompts.VERL_AGENT_PLACEHOLDERS). Unlike ALFWorld's, the first-step template carries the task: the
# page text under verl-agent starts after the instruction.
_VERL_AGENT_ASK = (
    "The actions you may take now:\n[\n{admissible_actions}\n].\n\n"
    "Pick your action for this step. First reason step by step about the page and what the task asks for inside "
    "<think> </think>. Then write one of the admissible actions for this step inside <action> </action>.\n"
)
VERL_AGENT_FIRST_TEMPLATE = (
    "You are a shopping agent on the WebShop online store. Your task is to: {task}.\n"
    "The page you see now: {observation}.\n" + _VERL_AGENT_ASK
)
VERL_AGENT_TEMPLATE = (
    "You are a shopping agent on the WebShop online store. Your task is to: {task}.\n"
    "You have taken {step_count} step(s) so far. Your last {history_length} observation(s), each with the action "
    "you took after it: {history}\n"
    "This is step {current_step}. The page you see now: {observation}.\n" + _VERL_AGENT_ASK
)
#: verl-agent's WebShop prompt limit: past this many characters the prompt with history is replaced by the
#: first-step template (env_manager.py ``WebshopEnvironmentManager.build_text_obs``).
VERL_AGENT_MAX_PROMPT_CHARS = 13_000

_STOPWORDS = frozenset(
    "a an the and or of in on at to for with from by is are be it its this that these those i me my we "
    "you your am do does not no as into than then so".split()
)
_PRICE_CLAUSE = re.compile(r",?\s*(and\s+)?price\s+lower\s+than\s+[\d.,]+\s+dollars", re.I)
_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.I | re.S)


# ----------------------------------------------------------------------------------------------- text utils
def normalize(text: str) -> str:
    """Lowercase, non-alphanumerics to spaces, collapse whitespace."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", str(text).lower()).split())


def tokenize(text: str) -> list[str]:
    """Search tokens: lowercase alphanumeric words without stopwords, plural ``s`` stripped."""
    out = []
    for tok in re.findall(r"[0-9a-z]+", str(text).lower()):
        if tok in _STOPWORDS:
            continue
        if len(tok) > 3 and tok.endswith("s") and not tok.endswith(("ss", "us")):
            tok = tok[:-1]
        out.append(tok)
    return out


def _phrase_in(needle: str, hay: str) -> bool:
    return bool(needle) and re.search(r"(?<![0-9a-z])" + re.escape(needle) + r"(?![0-9a-z])", hay) is not None


def _click_key(text: str) -> str:
    return " ".join(str(text).lower().split())


def _fmt_price(price: float) -> str:
    return f"${price:.2f}"


# --------------------------------------------------------------------------------------------------- reward
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


# ----------------------------------------------------------------------------------------------- data store
class _Store:
    """Products, goal splits and the BM25 index of one data source."""

    def __init__(self, products: list[dict], splits: dict[str, list[dict]], source: str):
        import bm25s

        self.source = source
        self.products = products
        self.by_asin = {p["asin"].lower(): i for i, p in enumerate(products)}
        self.splits = splits
        self.goal_by_id = {g["id"]: g for goals in splits.values() for g in goals}
        corpus = []
        for p in products:
            toks = tokenize(" ".join([p["title"], " ".join(p["attributes"]), p.get("category", ""),
                                      p.get("product_type", "")]))
            corpus.append(toks or ["empty"])
        self.bm25 = bm25s.BM25()
        self.bm25.index(corpus, show_progress=False)
        self._search_cache: dict[tuple, list[int]] = {}

    def search(self, query: str, k: int = MAX_RESULTS) -> list[int]:
        """Indices of the top-``k`` products for ``query`` (score > 0; ties broken by catalog order)."""
        toks = tuple(t for t in tokenize(query) if t in self.bm25.vocab_dict and t)
        key = (toks, k)
        hit = self._search_cache.get(key)
        if hit is not None:
            return hit
        if not toks:
            result: list[int] = []
        else:
            scores = np.asarray(self.bm25.get_scores(list(toks)), dtype=np.float64)
            cand = np.flatnonzero(scores > 0)
            order = cand[np.lexsort((cand, -scores[cand]))][:k]
            result = [int(i) for i in order]
        if len(self._search_cache) < 100_000:
            self._search_cache[key] = result
        return result


_STORES: dict[tuple, _Store] = {}
_STORES_LOCK = threading.Lock()


def _get_store(key: tuple, builder) -> _Store:
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = builder()
            _STORES[key] = store
        return store


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


# WebShop real-data loader -------------------------------------------------------------------------------
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


def get_store(data_dir: str | Path | None = None, variant: str = "1000") -> _Store:
    """The (cached) store of a data source: bundled when ``data_dir`` is None (and ``WEBSHOP_DATA`` unset)
    or ``"bundled"``, else the real WebShop files in ``data_dir``."""
    if data_dir is None:
        data_dir = os.environ.get("WEBSHOP_DATA") or None
    if data_dir is None or str(data_dir) == "bundled":
        return _get_store(("bundled",), lambda: _Store(*load_bundled(), source="bundled"))
    path = Path(data_dir).expanduser().resolve()
    return _get_store(("dir", str(path), variant),
                      lambda: _Store(*load_webshop_dir(path, variant), source=str(path)))


# --------------------------------------------------------------------------------------------- environment
class WebShopEnv(TextEnv):
    """WebShop text environment (see the module doc for pages, actions, reward and data).

    Args:
        data_dir: directory with the real WebShop files, ``"bundled"``, or None (``WEBSHOP_DATA`` if set,
            else the bundled catalog).
        variant: ``"1000"`` or ``"full"``: which real WebShop file set to read from ``data_dir``.
        split: the split an int ``task`` passed to ``reset`` indexes into (goal id strings work for any).

        protocol: ``"gigpo-trl"`` (this module's pages and reward) or ``"verl-agent"`` (the paper's code:
            :class:`PaperWebShopEnv`, which this constructor then returns).
        prompt_template: the user-message template, verbatim (default: this env's own wording); under
            ``"gigpo-trl"`` with the placeholders of ``DEFAULT_PROMPT_TEMPLATE``, under ``"verl-agent"`` the
            later-step template with those of :data:`gigpo_trl.prompts.VERL_AGENT_PLACEHOLDERS`.
        first_prompt_template: ``"verl-agent"`` only: the first-step template (no history); under ``"gigpo-trl"``
            passing one raises ``ValueError``.

    Every step's ``info["task_score"]`` is the WebShop score of the purchase (0.0 until something is bought).
    Instances pickle without their data (the unpickled copy fetches the cached store of the same source).
    """

    def __new__(cls, *args, protocol: str = "gigpo-trl", **kwargs):
        if cls is WebShopEnv and check_protocol(protocol) == "verl-agent":
            cls = PaperWebShopEnv
        return super().__new__(cls)

    name = "webshop"
    max_turns = 15
    system_prompt = SYSTEM_PROMPT
    prompt_template = PROMPT_TEMPLATE
    invalid_action = "<invalid action>"

    def __init__(self, data_dir: str | Path | None = None, variant: str = "1000", split: str = "train",
                 protocol: str = "gigpo-trl", prompt_template: str | None = None,
                 first_prompt_template: str | None = None):
        init_protocol(self, protocol, prompt_template, first_prompt_template)
        if data_dir is None:
            data_dir = os.environ.get("WEBSHOP_DATA") or "bundled"
        self._source = (str(data_dir), variant)
        self.store = get_store(*self._source)
        self.split = "eval" if split == "test" else split
        self._split(self.split)
        self.goal: dict | None = None
        self._done = True
        self._obs = ""

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "store"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.store = get_store(*self._source)

    # ---------------------------------------------------------------- tasks
    def tasks(self, split: str = "train"):
        """``datasets.Dataset`` of the goals of ``split`` ("train", "eval"; "test" = "eval")."""
        import datasets

        goals = self._split(split)
        return datasets.Dataset.from_dict({
            "task": [g["id"] for g in goals],
            "seed": list(range(len(goals))),
            "task_type": [g["task_type"] for g in goals],
        })

    def _split(self, split: str) -> list[dict]:
        key = "eval" if split == "test" else split
        if key not in self.store.splits:
            raise ValueError(f"unknown WebShop split {split!r}; use 'train', 'eval' or 'test'")
        return self.store.splits[key]

    def _resolve(self, task: Any) -> dict:
        if isinstance(task, (int, np.integer)) and not isinstance(task, bool):
            goals = self.store.splits[self.split]
            if not 0 <= int(task) < len(goals):
                raise ValueError(f"WebShop task index {task} out of range for the {self.split} split "
                                 f"({len(goals)} goals)")
            return goals[int(task)]
        if isinstance(task, str) and task in self.store.goal_by_id:
            return self.store.goal_by_id[task]
        raise ValueError(f"unknown WebShop task {task!r}; expected a goal id such as 'train-0042' or an "
                         "int index")

    # ---------------------------------------------------------------- episode
    def reset(self, task: Any = 0, seed: int | None = None) -> tuple[str, dict]:
        self.goal = self._resolve(task)
        self._page = "search"
        self._query = ""
        self._results: list[int] = []
        self._page_no = 1
        self._item: int | None = None
        self._selected: dict[str, str] = {}
        self._done = False
        self._obs = self._render()
        return self._obs, self._info(action_valid=True)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.goal is None:
            raise RuntimeError("WebShopEnv.step called before reset")
        if self._done:
            return self._obs, 0.0, True, self._info(action_valid=False)
        parsed = self._parse(action)
        if parsed is None:
            return self._obs, 0.0, False, self._info(action_valid=False)
        kind, arg = parsed
        if kind == "search":
            self._query = arg
            self._results = self.store.search(arg)
            self._page, self._page_no = "results", 1
        else:
            outcome = self._click(arg)
            if outcome is not None:
                self._done = True
                self._obs = self._render()
                info = self._info(action_valid=True)
                info.update(outcome)
                info["admissible_actions"] = []
                return self._obs, SUCCESS_REWARD if outcome["won"] else 0.0, True, info
        self._obs = self._render()
        return self._obs, 0.0, False, self._info(action_valid=True)

    def _parse(self, action: Any) -> tuple[str, str] | None:
        """``("search", query)`` or ``("click", clickable)`` if ``action`` is available here, else None."""
        if not isinstance(action, str):
            return None
        m = _ACTION_RE.match(action)
        if m is None:
            return None
        verb, arg = m.group(1).lower(), " ".join(m.group(2).split())
        if verb == "search":
            return ("search", arg) if self._page == "search" and arg else None
        key = _click_key(arg)
        clickables = self._clickables()
        if key in clickables:
            return "click", key
        squashed = key.replace(" ", "")
        for c in clickables:
            if c.replace(" ", "") == squashed:
                return "click", c
        return None

    def _click(self, target: str) -> dict | None:
        """Apply a (valid) click; returns the purchase outcome for ``buy now``, else None."""
        page = self._page
        if target == "back to search":
            self._page, self._query, self._results, self._page_no = "search", "", [], 1
            self._item, self._selected = None, {}
        elif page == "results":
            if target == "next >":
                self._page_no += 1
            elif target == "< prev":
                self._page_no -= 1
            else:
                self._item, self._selected, self._page = self.store.by_asin[target], {}, "item"
        elif page == "item":
            if target == "< prev":
                self._page, self._item, self._selected = "results", None, {}
            elif target in ("description", "features"):
                self._page = target
            elif target == "buy now":
                product = self.store.products[self._item]
                score = webshop_score(self.goal, product, self._selected)
                return {"task_score": score, "won": score == 1.0, "purchased_asin": product["asin"],
                        "selected_options": dict(self._selected)}
            else:
                product = self.store.products[self._item]
                for group, values in product["options"].items():
                    if target in [_click_key(v) for v in values]:
                        self._selected[group] = next(v for v in values if _click_key(v) == target)
                        break
        elif page in ("description", "features") and target == "< prev":
            self._page = "item"
        return None

    # ---------------------------------------------------------------- rendering
    def _page_slice(self) -> list[int]:
        start = (self._page_no - 1) * RESULTS_PER_PAGE
        return self._results[start:start + RESULTS_PER_PAGE]

    def _num_pages(self) -> int:
        return max(1, math.ceil(len(self._results) / RESULTS_PER_PAGE))

    def _clickables(self) -> list[str]:
        """Lowercase clickables of the current page (empty on the search page)."""
        if self._done or self._page == "search":
            return []
        out = ["back to search"]
        if self._page == "results":
            if self._page_no > 1:
                out.append("< prev")
            if self._page_no < self._num_pages():
                out.append("next >")
            out += [self.store.products[i]["asin"].lower() for i in self._page_slice()]
        elif self._page == "item":
            out.append("< prev")
            product = self.store.products[self._item]
            for values in product["options"].values():
                out += [_click_key(v) for v in values if _click_key(v) not in out]
            out += ["description", "features", "buy now"]
        else:
            out.append("< prev")
        return out

    def _render(self) -> str:
        parts = ["WebShop", "Instruction:", self.goal["instruction"]]
        if self._page == "search":
            parts.append("Search")
        elif self._page == "results":
            parts += ["Back to Search", f"Page {self._page_no} (Total results: {len(self._results)})"]
            if self._page_no > 1:
                parts.append("< Prev")
            if self._page_no < self._num_pages():
                parts.append("Next >")
            for i in self._page_slice():
                p = self.store.products[i]
                parts += [p["asin"], p["title"], _fmt_price(p["price"])]
        else:
            product = self.store.products[self._item]
            parts += ["Back to Search", "< Prev"]
            if self._page == "item":
                for group, values in product["options"].items():
                    parts += [group, *values]
                if self._selected:
                    chosen = ", ".join(f"{g}: {v}" for g, v in self._selected.items())
                    parts.append(f"Selected options: {chosen}")
                rating = product.get("rating")
                parts += [product["title"], f"Price: {_fmt_price(product['price'])}",
                          f"Rating: {rating if rating is not None else 'N.A.'}", "Description", "Features",
                          "Buy Now"]
            elif self._page == "description":
                parts.append(product.get("description") or "N.A.")
            else:
                parts += product.get("features") or ["N.A."]
        return " [SEP] ".join(str(x) for x in parts)

    def _info(self, action_valid: bool) -> dict:
        if self._done:
            admissible = []
        elif self._page == "search":
            admissible = [SEARCH_PLACEHOLDER]
        else:
            admissible = [f"click[{c}]" for c in self._clickables()]
        return {
            "instruction": self.goal["instruction"],
            "admissible_actions": admissible,
            "task_type": self.goal["task_type"],
            "goal_id": self.goal["id"],
            "won": False,
            "action_valid": action_valid,
            "task_score": 0.0,
        }

    # ---------------------------------------------------------------- expert (test / benchmark utility)
    def expert_action(self) -> str:
        """Next action of a scripted, goal-privileged expert (a test and benchmark utility, not a baseline
        agent): it searches with the instruction minus its price clause, walks the result pages to the
        result that would score best if bought with the goal's options (preferring the goal's own product,
        then the highest-ranked), clicks the goal's options that product offers, and buys."""
        if self.goal is None or self._done:
            return self.invalid_action
        if self._page == "search":
            query = _PRICE_CLAUSE.sub("", self.goal["instruction"]).strip() or self.goal["instruction"]
            return f"search[{query}]"
        if self._page in ("description", "features"):
            return "click[< prev]"
        if self._page == "results":
            if not self._results:
                return "click[back to search]"
            best = max(range(len(self._results)), key=lambda r: (self._achievable(self._results[r]), -r))
            page = best // RESULTS_PER_PAGE + 1
            if page > self._page_no:
                return "click[next >]"
            if page < self._page_no:
                return "click[< prev]"
            return f"click[{self.store.products[self._results[best]]['asin'].lower()}]"
        product = self.store.products[self._item]
        offered = {_click_key(v): v for values in product["options"].values() for v in values}
        chosen = {_click_key(v) for v in self._selected.values()}
        for opt in self.goal["options"]:
            key = _click_key(opt)
            if key in offered and key not in chosen:
                return f"click[{key}]"
        return "click[buy now]"

    def _achievable(self, idx: int) -> tuple[float, bool]:
        product = self.store.products[idx]
        offered = {normalize(v): v for values in product["options"].values() for v in values}
        opts = [offered[normalize(o)] for o in self.goal["options"] if normalize(o) in offered]
        score = webshop_score(self.goal, product, opts)
        return score, product["asin"] == self.goal["asin"]


# ------------------------------------------------------------------------------- the paper's protocol
class _PaperStore:
    """Products (engine shape), their prices, goal splits, POS tagger and BM25 index of one data source under
    ``protocol="verl-agent"`` (see :mod:`gigpo_trl.envs.webshop_paper`)."""

    def __init__(self, products: list[dict], prices: dict[str, float], splits: dict[str, list[dict]],
                 nlp, source: str):
        import bm25s

        self.source, self.products, self.prices, self.splits, self.nlp = source, products, prices, splits, nlp
        self.by_asin = {p["asin"]: p for p in products}
        self.goal_by_id = {g["id"]: g for goals in splits.values() for g in goals}
        # pyserini's BM25 defaults (k1 0.9, b 0.4) on the paper's document fields; our tokenizer, not Lucene's.
        self.bm25 = bm25s.BM25(k1=0.9, b=0.4)
        self.bm25.index([tokenize(paper.search_document(p)) or ["empty"] for p in products], show_progress=False)
        self._cache: dict[tuple, list[dict]] = {}

    def search(self, query: str) -> list[dict]:
        """The top 50 products for ``query`` (BM25 score > 0; ties by catalog order)."""
        toks = tuple(t for t in tokenize(query) if t in self.bm25.vocab_dict)
        if toks not in self._cache:
            hits: list[dict] = []
            if toks:
                scores = np.asarray(self.bm25.get_scores(list(toks)), dtype=np.float64)
                cand = np.flatnonzero(scores > 0)
                hits = [self.products[int(i)] for i in cand[np.lexsort((cand, -scores[cand]))][:paper.SEARCH_RETURN_N]]
            if len(self._cache) < 100_000:
                self._cache[toks] = hits
            return hits
        return self._cache[toks]


def load_paper_dir(data_dir: str | Path, variant: str = "1000", goal_seed: int = paper.GOAL_SHUFFLE_SEED):
    """The real WebShop files as the paper's code reads them: ``(products, prices, splits)``.

    ``variant="1000"``: ``items_shuffle_1000.json`` + ``items_ins_v2_1000.json`` (verl-agent ``use_small``);
    ``"full"``: ``items_shuffle.json`` + ``items_ins_v2.json``. (engine.py also opens ``items_human_ins.json``, used
    only by human goals; not needed here.) Prices and price caps are drawn from ``random.Random(goal_seed)``, goals
    shuffled by ``random.Random(233)``; ``splits = {"eval": goals[0:500], "train": goals[500:]}``, each goal with
    ``task_type`` = its product's ``category`` (beauty, fashion, ...).

    Raises:
        FileNotFoundError: a file is missing (the message names it and its expected content).
        ValueError: a file is malformed.
    """
    if variant not in ("1000", "full"):
        raise ValueError(f"unknown WebShop data variant {variant!r}; use '1000' or 'full'")
    data_dir = Path(data_dir)
    suffix = "_1000" if variant == "1000" else ""
    raw = _read_json(data_dir / f"items_shuffle{suffix}.json", _PRODUCTS_EXPECTED)
    ins = _read_json(data_dir / f"items_ins_v2{suffix}.json", _INS_EXPECTED)
    if not isinstance(raw, list):
        raise ValueError(f"{data_dir / f'items_shuffle{suffix}.json'}: expected {_PRODUCTS_EXPECTED}")
    if not isinstance(ins, dict):
        raise ValueError(f"{data_dir / f'items_ins_v2{suffix}.json'}: expected {_INS_EXPECTED}")
    products = paper.paper_products(raw, ins)
    rng = random.Random(goal_seed)
    prices = paper.product_prices(products, rng)
    goals = paper.synthetic_goals(products, prices, rng)
    if len(goals) <= paper.NUM_TEST_GOALS:
        raise ValueError(f"{data_dir}: {len(goals)} goals; the paper's split needs more than "
                         f"{paper.NUM_TEST_GOALS} (test = the first 500)")
    splits = paper.split_goals(goals)
    for goals_ in splits.values():
        for g in goals_:
            g["task_type"] = g["category"]
    return products, prices, splits


def paper_bundled() -> tuple[list[dict], dict[str, float], dict[str, list[dict]], paper.LexiconTagger]:
    """The bundled catalog in the engine's shapes, with its own goals (train / eval as bundled) and a
    :class:`~gigpo_trl.envs.webshop_paper.LexiconTagger` of its product-type, category and brand words."""
    products, splits = load_bundled()
    out, nouns = [], set()
    for p in products:
        out.append({
            "asin": p["asin"], "name": p["title"], "Title": p["title"], "Description": p.get("description") or "",
            "BulletPoints": list(p.get("features") or []), "Attributes": list(p.get("attributes") or []),
            "query": p["product_type"].lower().strip(), "category": p.get("top", ""),
            "product_category": p.get("category", ""), "pricing": [float(p["price"])],
            "Price": f"${float(p['price'])}", "Rating": "N.A.",
            "options": {g.lower(): [v.strip().replace("/", " | ").lower() for v in vs]
                        for g, vs in p["options"].items()},
        })
        nouns.update(re.findall(r"[0-9a-z]+", (p["product_type"] + " " + p.get("category", "")).lower()))
        nouns.update(f.split(":", 1)[1].strip().lower() for f in p.get("features", []) if f.startswith("Brand:"))
    by_asin = {p["asin"]: p for p in out}
    paper_splits = {}
    for split, goals in splits.items():
        paper_splits[split] = [{
            "id": g["id"], "asin": g["asin"], "category": by_asin[g["asin"]]["category"],
            "query": by_asin[g["asin"]]["query"], "name": by_asin[g["asin"]]["Title"],
            "product_category": by_asin[g["asin"]]["product_category"], "instruction_text": g["instruction"],
            "attributes": list(g["attributes"]), "price_upper": float(g["price_upper"]),
            "goal_options": {k: v.strip().replace("/", " | ").lower() for k, v in g["option_groups"].items()},
            "task_type": g["task_type"],
        } for g in goals]
    prices = {p["asin"]: p["pricing"][0] for p in out}
    return out, prices, paper_splits, paper.LexiconTagger(nouns)


def get_paper_store(data_dir: str | Path | None = None, variant: str = "1000", nlp=None,
                    goal_seed: int = paper.GOAL_SHUFFLE_SEED) -> _PaperStore:
    """The (cached) ``protocol="verl-agent"`` store of a data source (as :func:`get_store`). ``nlp``: the type
    reward's POS tagger; None = the bundled catalog's lexicon tagger, or spaCy ``en_core_web_sm`` for real data
    (loaded here, so a missing model fails at construction with the install command)."""
    if data_dir is None:
        data_dir = os.environ.get("WEBSHOP_DATA") or None
    if data_dir is None or str(data_dir) == "bundled":
        def build():
            products, prices, splits, tagger = paper_bundled()
            return _PaperStore(products, prices, splits, tagger, source="bundled")

        store = _get_store(("paper", "bundled"), build)
    else:
        path = Path(data_dir).expanduser().resolve()
        store = _get_store(("paper", str(path), variant, goal_seed),
                           lambda: _PaperStore(*load_paper_dir(path, variant, goal_seed), nlp=None, source=str(path)))
    return store


class PaperWebShopEnv(WebShopEnv):
    """WebShop as the GiGPO paper's code runs it (``WebShopEnv(protocol="verl-agent")`` returns one); see
    :mod:`gigpo_trl.envs.webshop_paper` for goals, reward, pages and sources.

    Observations are verl-agent's ``format_obs`` of the page: its text parts after the instruction, each quoted,
    joined by `` [SEP] `` (``'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] 'Next >' [SEP] ...``).
    ``info["admissible_actions"]`` is ``format_avail_actions``: ``search[<your query>]`` on the search page, then
    ``click[x]`` for every clickable (buttons, product ids, option values). ``search[q]`` works from any page;
    ``click[x]`` with ``x`` (lower-cased) a clickable of the page other than ``search`` acts; anything else leaves the
    page as it is (reward 0, not done). The paper never checks admissibility, so ``info["action_valid"]`` is always
    True (``info["action_executed"]`` says whether the action did something). ``click[buy now]`` ends the episode:
    ``info["task_score"]`` = :func:`paper_reward`, reward 10 if it is 1.0 else 0, ``info["won"]``.

    Args:
        data_dir, variant, split: as :class:`WebShopEnv` (``split`` "eval"/"test" = goals[0:500] on real data).
        nlp: POS tagger of the type reward (``nlp(text)`` -> tokens with ``.text``, ``.pos_``). None: the bundled
            catalog's lexicon tagger, or spaCy ``en_core_web_sm`` for real data (loaded at construction; ImportError
            with the install command when missing).
        goal_seed: seed of the prices and price caps of the real data's synthetic goals (default 233).
        prompt_template, first_prompt_template: the later-step and first-step user-message templates, verbatim
            (placeholders of :data:`gigpo_trl.prompts.VERL_AGENT_PLACEHOLDERS`); default: our wording,
            ``VERL_AGENT_TEMPLATE`` / ``VERL_AGENT_FIRST_TEMPLATE``.

    Prompts (:func:`gigpo_trl.prompts.build_verl_agent_prompt`): one user message; the admissible list one quoted
    action a line, each followed by a comma (``admissible_style = "webshop"``); a prompt with history longer than
    ``max_prompt_chars`` (13,000, verl-agent's rule) is replaced by the first-step one.
    """

    admissible_style = "webshop"
    max_prompt_chars = VERL_AGENT_MAX_PROMPT_CHARS

    def __init__(self, data_dir: str | Path | None = None, variant: str = "1000", split: str = "train",
                 protocol: str = "verl-agent", nlp=None, goal_seed: int = paper.GOAL_SHUFFLE_SEED,
                 prompt_template: str | None = None, first_prompt_template: str | None = None):
        if check_protocol(protocol) != "verl-agent":
            raise ValueError(f"PaperWebShopEnv runs protocol='verl-agent', got protocol={protocol!r}")
        init_protocol(self, protocol, prompt_template, first_prompt_template,
                      (VERL_AGENT_TEMPLATE, VERL_AGENT_FIRST_TEMPLATE))
        if data_dir is None:
            data_dir = os.environ.get("WEBSHOP_DATA") or "bundled"
        self._source = (str(data_dir), variant, goal_seed)
        self.store = get_paper_store(data_dir, variant, goal_seed=goal_seed)
        self._nlp = nlp
        if nlp is None and self.store.nlp is None:  # real data: spaCy, loaded now so a missing model fails here
            self.store.nlp = paper.load_spacy()
        self.split = "eval" if split == "test" else split
        self._split(self.split)
        self.goal: dict | None = None
        self._done = True
        self._obs = ""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        data_dir, variant, goal_seed = self._source
        self.store = get_paper_store(data_dir, variant, goal_seed=goal_seed)
        if self._nlp is None and self.store.nlp is None:
            self.store.nlp = paper.load_spacy()

    def tasks(self, split: str = "train"):
        """``datasets.Dataset`` of the goals of ``split`` ("train", "eval"; "test" = "eval")."""
        import datasets

        goals = self._split(split)
        return datasets.Dataset.from_dict({"task": [g["id"] for g in goals], "seed": list(range(len(goals))),
                                           "task_type": [g["task_type"] for g in goals]})

    def paper_eval_tasks(self, num_episodes: int = 128, seed: int = 0, eval_round: int = 0):
        """The paper's validation episodes as a task dataset (columns ``task`` = goal id, ``seed`` = worker index,
        ``task_type``), in worker order: the test goals at
        :func:`~gigpo_trl.envs.webshop_paper.paper_eval_goal_indices` ``(num_episodes, seed, eval_round)``, 128
        distinct goals of the 500 per round with the paper's defaults. On real data this is verl-agent's draw
        exactly; the bundled catalog has 200 test goals, so there the same generator draws from ``range(200)``.
        Sample them at temperature 0.4 to match the paper.

        Raises:
            ValueError: ``num_episodes`` < 1 or more than the test goals, or ``eval_round`` < 0.
        """
        import datasets

        goals = self._split("eval")
        idx = paper.paper_eval_goal_indices(num_episodes, seed, eval_round,
                                            num_test_goals=min(len(goals), paper.NUM_TEST_GOALS))
        return datasets.Dataset.from_dict({"task": [goals[i]["id"] for i in idx], "seed": list(range(len(idx))),
                                           "task_type": [goals[i]["task_type"] for i in idx]})

    def reset(self, task: Any = 0, seed: int | None = None) -> tuple[str, dict]:
        self.goal = self._resolve(task)
        self._page, self._keywords, self._results, self._page_no = "search", "", [], 1
        self._asin: str | None = None
        self._options: dict[str, str] = {}
        self._done = False
        self._obs = self._render()
        return self._obs, self._info(executed=True)

    # ---------------------------------------------------------------- step (web_agent_text_env.py step / receive)
    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.goal is None:
            raise RuntimeError("PaperWebShopEnv.step called before reset")
        if self._done:
            return self._obs, 0.0, True, self._info(executed=False)
        name, arg = paper.parse_action(action) if isinstance(action, str) else (None, None)
        arg = arg.lower() if arg is not None else None
        clickable = self._clickables()
        if name == "search" and arg:
            self._keywords, self._page_no, self._page = arg, 1, "results"
            self._results = self.store.search(" ".join(arg.split(" ")))
            self._asin, self._options = None, {}
        elif name == "click" and arg in clickable and arg != "search":
            score = self._click(arg, clickable[arg])
            if score is not None:
                self._done = True
                self._obs = "'Thank you for shopping with us!' [SEP] 'Your score (min 0.0, max 1.0)' [SEP] " \
                            f"'{score}'"
                info = self._info(executed=True)
                info.update(task_score=score, won=score == 1.0, purchased_asin=self._asin,
                            selected_options=dict(self._options))
                return self._obs, paper.SUCCESS_REWARD if score == 1.0 else 0.0, True, info
        else:
            return self._obs, 0.0, False, self._info(executed=False)
        self._obs = self._render()
        return self._obs, 0.0, False, self._info(executed=True)

    def _click(self, target: str, kind: tuple) -> float | None:
        """SimServer.receive's routing, in its order; returns the score on ``buy now``."""
        if target == paper.END_BUTTON:
            product = self.store.by_asin[self._asin]
            return float(paper_reward(product, self.goal, self.store.prices[self._asin], self._options,
                                      nlp=self._nlp if self._nlp is not None else self.store.nlp))
        if target == paper.BACK_TO_SEARCH:
            self._page, self._keywords, self._results, self._page_no = "search", "", [], 1
            self._asin, self._options = None, {}
        elif target == paper.NEXT_PAGE and self._page == "results":
            self._page_no += 1
        elif target == paper.PREV_PAGE and self._page == "results":
            self._page_no -= 1
        elif target == paper.PREV_PAGE and self._page in paper.SUB_PAGES:
            self._page = "item"
        elif target == paper.PREV_PAGE and self._page == "item":
            self._page, self._asin, self._options = "results", None, {}
        elif target in paper.SUB_PAGES:
            self._page = target
        elif kind[0] == "product":
            self._page, self._asin = "item", kind[1]
        elif kind[0] == "option":
            self._options[kind[1]] = target
        return None

    # ---------------------------------------------------------------- pages
    def _page_products(self) -> list[dict]:
        start = (self._page_no - 1) * paper.PRODUCT_WINDOW
        return self._results[start:start + paper.PRODUCT_WINDOW]

    def _clickables(self) -> dict[str, tuple]:
        product = self.store.by_asin[self._asin] if self._asin else None
        return paper.clickables(self._page, self._page_products(), product, self._page_no)

    def _render(self) -> str:
        product = self.store.by_asin[self._asin] if self._asin else None
        parts = paper.page_parts(self._page, self._page_products(), product, self._page_no, len(self._results))
        return paper.format_observation(parts)

    def _info(self, executed: bool) -> dict:
        admissible = [] if self._done else paper.available_actions(self._page, self._clickables())
        # the task text as format_obs finds it on the page: the instruction's text node, stripped
        return {"instruction": self.goal["instruction_text"].strip(), "admissible_actions": admissible,
                "task_type": self.goal["task_type"], "goal_id": self.goal["id"], "won": False,
                "action_valid": True, "action_executed": executed, "task_score": 0.0}

    def expert_action(self) -> str:
        """Next action of a goal-privileged scripted expert (a test utility): search the goal's instruction minus
        its option and price text, open the goal's product (any result page), click the goal's options, buy."""
        if self.goal is None or self._done:
            return self.invalid_action
        if self._page == "search" or (self._page == "results" and not self._results):
            query = re.split(r" with |, and price lower than", self.goal["instruction_text"])[0]
            return f"search[{query}]"
        if self._page in paper.SUB_PAGES:
            return "click[< prev]"
        if self._page == "results":
            asins = [p["asin"] for p in self._results]
            if self.goal["asin"] not in asins:
                return "click[back to search]"
            page = asins.index(self.goal["asin"]) // paper.PRODUCT_WINDOW + 1
            if page != self._page_no:
                return "click[next >]" if page > self._page_no else "click[< prev]"
            return f"click[{self.goal['asin'].lower()}]"
        if self._asin != self.goal["asin"]:
            return "click[< prev]"
        for name, value in self.goal["goal_options"].items():
            if self._options.get(name) != value and value in self._clickables():
                return f"click[{value}]"
        return "click[buy now]"

#!/usr/bin/env python
"""Generate the bundled WebShop-style catalog and goals (``gigpo_trl/data/webshop/``).

The output is fully determined by ``--seed`` (default 20240601): the script uses only ``random.Random``
with that seed, iterates lists (never sets), writes JSON with sorted keys and compact separators, and
gzips with ``mtime=0``, so re-running it reproduces the committed files byte for byte.

Files written:

- ``catalog.json.gz``: ``{"version": 1, "products": [...]}``; each product has ``asin``, ``title``,
  ``product_type``, ``category`` (a ``"Top › Sub › type"`` path), ``price`` (float), ``attributes``
  (list of str), ``options`` (dict option group -> list of values), ``description`` (str),
  ``features`` (list of str) and ``rating`` (float).
- ``goals.json.gz``: ``{"version": 1, "train": [...], "eval": [...]}``; each goal has ``id``
  (``"train-0042"``), ``asin`` (the product it was derived from), ``product_type``, ``instruction``,
  ``attributes`` (subset of the product's), ``options`` (dict group -> one value the product offers),
  ``price_upper`` (>= the product's price).

Every goal is achievable by construction: its product exists, has the attributes, offers the options
and costs no more than ``price_upper``. Instruction texts are unique over both splits, and so are goal specs
(product type, attributes and option values; the price cap aside): no goal of one split is a reworded or
re-priced copy of a goal of the other.

Usage: ``python scripts/make_webshop_catalog.py [--out DIR] [--seed N]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import re
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "gigpo_trl" / "data" / "webshop"
DEFAULT_SEED = 20240601
PRODUCTS_PER_TYPE = 45
NUM_TRAIN = 1000
NUM_EVAL = 200

COLORS = ["black", "white", "grey", "navy blue", "red", "pink", "beige", "olive green", "light blue", "brown"]

# product_type -> spec. Option groups map a group name to its value pool; a product offers a random
# subset of each pool. Attribute phrases must not contain one another (checked below).
TYPES: dict[str, dict] = {
    "shoes": {
        "category": "Clothing, Shoes & Jewelry › Shoes",
        "nouns": ["running shoes", "walking shoes", "sneakers", "trail shoes", "tennis shoes"],
        "attributes": ["non slip", "rubber sole", "lightweight", "breathable mesh", "arch support",
                       "memory foam", "waterproof", "wide toe box"],
        "options": {"size": ["6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12"],
                    "color": COLORS},
        "price": (24.0, 119.0),
        "audience": ["for men", "for women", "unisex"],
    },
    "t-shirt": {
        "category": "Clothing, Shoes & Jewelry › Tops & Tees",
        "nouns": ["t-shirt", "graphic tee", "crew neck t-shirt", "v-neck t-shirt", "pocket tee"],
        "attributes": ["short sleeve", "cotton", "moisture wicking", "machine wash", "slim fit",
                       "relaxed fit", "tagless", "quick dry"],
        "options": {"size": ["x-small", "small", "medium", "large", "x-large", "xx-large"], "color": COLORS},
        "price": (8.0, 34.0),
        "audience": ["for men", "for women", "for teens"],
    },
    "shampoo": {
        "category": "Beauty & Personal Care › Hair Care",
        "nouns": ["shampoo", "shampoo and conditioner set", "clarifying shampoo", "daily shampoo"],
        "attributes": ["sulfate free", "paraben free", "for dry hair", "for curly hair", "color safe",
                       "tea tree oil", "argan oil", "natural ingredients"],
        "options": {"size": ["8 fl oz", "12 fl oz", "16 fl oz", "33.8 fl oz"],
                    "scent": ["lavender", "unscented", "coconut", "mint", "citrus"]},
        "price": (6.0, 39.0),
        "audience": ["for women", "for men", "for all hair types"],
    },
    "headphones": {
        "category": "Electronics › Headphones",
        "nouns": ["wireless earbuds", "over ear headphones", "on ear headphones", "sports earphones"],
        "attributes": ["noise cancelling", "bluetooth 5.3", "long battery life", "water resistant",
                       "built-in microphone", "fast charging", "hands free"],
        "options": {"color": ["black", "white", "blue", "rose gold", "silver", "green"]},
        "price": (15.0, 249.0),
        "audience": ["for iphone and android", "for workout", "for travel"],
    },
    "coffee": {
        "category": "Grocery & Gourmet Food › Beverages",
        "nouns": ["ground coffee", "whole bean coffee", "coffee pods", "instant coffee"],
        "attributes": ["usda organic", "fair trade", "low acid", "kosher", "non gmo", "single origin"],
        "options": {"roast": ["light roast", "medium roast", "dark roast", "espresso roast"],
                    "size": ["10 ounce", "12 ounce", "24 ounce", "2 pound"]},
        "price": (7.0, 44.0),
        "audience": ["", "100% arabica", "colombian"],
    },
    "tea": {
        "category": "Grocery & Gourmet Food › Beverages",
        "nouns": ["green tea", "herbal tea", "black tea", "loose leaf tea", "tea bags"],
        "attributes": ["caffeine free", "usda organic", "gluten free", "non gmo", "individually wrapped",
                       "sugar free"],
        "options": {"flavor": ["peppermint", "chamomile", "lemon ginger", "earl grey", "jasmine", "hibiscus"],
                    "count": ["20 count", "40 count", "100 count"]},
        "price": (4.0, 29.0),
        "audience": ["", "variety pack", "premium"],
    },
    "backpack": {
        "category": "Luggage & Travel Gear › Backpacks",
        "nouns": ["laptop backpack", "hiking backpack", "travel backpack", "school backpack"],
        "attributes": ["water resistant", "usb charging port", "anti theft", "padded laptop compartment",
                       "lightweight", "large capacity"],
        "options": {"color": COLORS, "size": ["15.6 inch", "17 inch", "13 inch"]},
        "price": (19.0, 89.0),
        "audience": ["for men", "for women", "for college"],
    },
    "phone case": {
        "category": "Cell Phones & Accessories › Cases",
        "nouns": ["phone case", "clear case", "wallet case", "rugged case"],
        "attributes": ["shockproof", "wireless charging compatible", "ultra thin", "card holder",
                       "kickstand", "scratch resistant"],
        "options": {"device": ["iphone 15", "iphone 15 pro", "galaxy s24", "pixel 8"],
                    "color": ["black", "clear", "blue", "purple", "red", "green"]},
        "price": (7.0, 34.0),
        "audience": ["", "with screen protector", "drop protection"],
    },
    "candle": {
        "category": "Home & Kitchen › Home Decor",
        "nouns": ["scented candle", "soy candle set", "jar candle", "tealight candles"],
        "attributes": ["long lasting", "soy wax", "lead free", "non toxic", "hand poured",
                       "natural ingredients"],
        "options": {"scent": ["vanilla", "lavender", "sandalwood", "eucalyptus", "ocean breeze", "cinnamon"],
                    "count": ["1 pack", "3 pack", "6 pack"]},
        "price": (9.0, 44.0),
        "audience": ["for home", "gift for women", "aromatherapy"],
    },
    "dog food": {
        "category": "Pet Supplies › Dogs",
        "nouns": ["dry dog food", "wet dog food", "puppy food", "dog treats"],
        "attributes": ["grain free", "high protein", "real meat", "no artificial flavors",
                       "natural ingredients", "for small breeds"],
        "options": {"flavor": ["chicken", "beef", "salmon", "lamb", "turkey"],
                    "size": ["4 pound", "15 pound", "30 pound"]},
        "price": (9.0, 79.0),
        "audience": ["", "adult", "all life stages"],
    },
    "lipstick": {
        "category": "Beauty & Personal Care › Makeup",
        "nouns": ["matte lipstick", "liquid lipstick", "lip gloss", "lip tint"],
        "attributes": ["long lasting", "cruelty free", "waterproof", "paraben free", "highly pigmented",
                       "moisturizing"],
        "options": {"color": ["ruby red", "nude", "berry", "coral", "mauve", "pink", "plum"]},
        "price": (5.0, 29.0),
        "audience": ["for women", "", "set"],
    },
    "desk lamp": {
        "category": "Tools & Home Improvement › Lighting",
        "nouns": ["led desk lamp", "reading lamp", "clip on lamp", "architect lamp"],
        "attributes": ["dimmable", "eye caring", "usb charging port", "touch control", "adjustable arm",
                       "energy efficient"],
        "options": {"color": ["black", "white", "silver", "gold"]},
        "price": (14.0, 69.0),
        "audience": ["for home office", "for bedroom", "for study"],
    },
    "yoga mat": {
        "category": "Sports & Outdoors › Exercise & Fitness",
        "nouns": ["yoga mat", "exercise mat", "pilates mat", "travel yoga mat"],
        "attributes": ["non slip", "extra thick", "eco friendly", "carrying strap", "lightweight",
                       "double sided"],
        "options": {"color": ["purple", "blue", "black", "pink", "grey", "teal"],
                    "thickness": ["1/8 inch", "1/4 inch", "1/2 inch"]},
        "price": (14.0, 59.0),
        "audience": ["for women", "for men", "for home workout"],
    },
    "protein powder": {
        "category": "Health & Household › Sports Nutrition",
        "nouns": ["whey protein powder", "plant protein powder", "protein shake mix", "casein protein"],
        "attributes": ["gluten free", "low carb", "non gmo", "keto friendly", "no added sugar",
                       "soy free"],
        "options": {"flavor": ["chocolate", "vanilla", "strawberry", "unflavored", "cookies and cream"],
                    "size": ["1 pound", "2 pound", "5 pound"]},
        "price": (19.0, 69.0),
        "audience": ["", "for muscle gain", "post workout"],
    },
}

BRAND_PARTS_A = ["nord", "vela", "kora", "brio", "lumo", "tavi", "zeno", "mira", "oslo", "peak", "riva",
                 "sol", "amber", "cedar", "echo", "fable", "haven", "iris", "juno", "kestrel"]
BRAND_PARTS_B = ["ly", "ix", "wear", "co", "craft", "works", "lab", "ora", "ton", "vale"]

DESCRIPTION_TEMPLATES = [
    "The {brand} {noun} is made for everyday use. {attrs_sentence} Available in {n_opts} variants.",
    "Meet the {noun} from {brand}. {attrs_sentence} Backed by a 30 day return policy.",
    "{brand} designed this {noun} with care. {attrs_sentence} A great pick for daily routines.",
]

OPTION_PHRASES = {
    "size": "in size {v}",
    "color": "in {v} color",
    "scent": "with {v} scent",
    "flavor": "with {v} flavor",
    "roast": "in {v}",
    "count": "in a {v} box",
    "device": "for {v}",
    "thickness": "that is {v} thick",
}

INSTRUCTION_TEMPLATES = [
    "i need {article} {pre}{noun}{post}{opts}, and price lower than {price} dollars",
    "i am looking for {article} {pre}{noun}{post}{opts}, and price lower than {price} dollars",
    "find me {article} {pre}{noun}{post}{opts}, and price lower than {price} dollars",
    "i want to buy {article} {pre}{noun}{post}{opts}, and price lower than {price} dollars",
    "please get me {article} {pre}{noun}{post}{opts}, and price lower than {price} dollars",
]


def _phrase_in(needle: str, hay: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(needle) + r"(?!\w)", hay) is not None


def _check_specs() -> None:
    attrs = sorted({a for spec in TYPES.values() for a in spec["attributes"]})
    for a in attrs:
        for b in attrs:
            if a != b and _phrase_in(a, b):
                raise AssertionError(f"attribute {a!r} is contained in {b!r}")
    for name, spec in TYPES.items():
        values = [v for pool in spec["options"].values() for v in pool]
        if len(values) != len(set(values)):
            raise AssertionError(f"option values of {name!r} are not unique across groups")


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _make_products(rng: random.Random) -> list[dict]:
    products: list[dict] = []
    used_asins: set[str] = set()
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    brands = [a + b for a in BRAND_PARTS_A for b in BRAND_PARTS_B]
    for ptype, spec in TYPES.items():
        top, sub = spec["category"].split(" › ")
        for _ in range(PRODUCTS_PER_TYPE):
            while True:
                asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
                if asin not in used_asins:
                    used_asins.add(asin)
                    break
            brand = rng.choice(brands).capitalize()
            noun = rng.choice(spec["nouns"])
            audience = rng.choice(spec["audience"])
            n_attr = rng.randint(3, min(5, len(spec["attributes"])))
            attributes = rng.sample(spec["attributes"], n_attr)
            options: dict[str, list[str]] = {}
            for group, pool in spec["options"].items():
                k = rng.randint(min(2, len(pool)), min(6, len(pool)))
                chosen = rng.sample(pool, k)
                options[group] = [v for v in pool if v in chosen]  # keep the pool's order
            lo, hi = spec["price"]
            price = math.floor(rng.uniform(lo, hi)) + rng.choice([0.99, 0.49, 0.95, 0.29])
            price = round(price, 2)
            title_words = " ".join(w.capitalize() for w in noun.split())
            attr_part = ", ".join(a.title() for a in attributes)
            audience_part = f" {audience.title()}" if audience else ""
            title = f"{brand} {title_words}{audience_part} - {attr_part}"
            verbs = ["designed to be", "certified", "tested as", "made"]
            features = [f"{a.capitalize()}: {rng.choice(verbs)} {a}" for a in attributes]
            features.append(f"Brand: {brand}")
            attrs_sentence = "It is " + ", ".join(attributes[:-1]) + f" and {attributes[-1]}."
            description = rng.choice(DESCRIPTION_TEMPLATES).format(
                brand=brand, noun=noun, attrs_sentence=attrs_sentence,
                n_opts=math.prod(len(v) for v in options.values()),
            )
            products.append({
                "asin": asin,
                "title": title,
                "product_type": ptype,
                "category": f"{top} › {sub} › {ptype}",
                "price": price,
                "attributes": attributes,
                "options": options,
                "description": description,
                "features": features,
                "rating": round(rng.uniform(3.0, 5.0), 1),
                "noun": noun,
            })
    return products


def _make_goal(rng: random.Random, product: dict) -> dict:
    n_attr = rng.randint(1, min(3, len(product["attributes"])))
    attrs = rng.sample(product["attributes"], n_attr)
    groups = list(product["options"])
    n_opt = rng.randint(0 if len(groups) == 1 else 1, len(groups))
    if len(groups) == 1 and rng.random() < 0.8:
        n_opt = 1
    picked = rng.sample(groups, n_opt)
    chosen_groups = [g for g in groups if g in picked]
    options = {g: rng.choice(product["options"][g]) for g in chosen_groups}
    price_upper = float(10 * math.ceil(product["price"] / 10) + 10 * rng.randint(0, 2))
    pre = [a for a in attrs if not a.startswith(("for ", "with ", "no "))]
    post = [a for a in attrs if a not in pre]
    pre_txt = _join(pre) + " " if pre else ""
    post = [a if a.startswith(("for ", "with ")) else "with " + a for a in post]
    post_txt = (" " + _join(post)) if post else ""
    opts_txt = "".join(" " + OPTION_PHRASES[g].format(v=v) for g, v in options.items())
    noun = product["noun"]
    first = (pre_txt or noun)
    instruction = rng.choice(INSTRUCTION_TEMPLATES).format(
        article=_article(first), pre=pre_txt, noun=noun, post=post_txt, opts=opts_txt,
        price=f"{price_upper:.2f}",
    )
    return {
        "asin": product["asin"],
        "product_type": product["product_type"],
        "instruction": instruction,
        "attributes": attrs,
        "options": options,
        "price_upper": price_upper,
    }


def _spec(goal: dict) -> tuple:
    """What the reward of a goal depends on, the price cap aside: product type, attributes, option values."""
    return goal["product_type"], tuple(sorted(goal["attributes"])), tuple(sorted(goal["options"].values()))


def generate(seed: int = DEFAULT_SEED) -> tuple[dict, dict]:
    """Return ``(catalog, goals)`` as JSON-ready dicts."""
    _check_specs()
    rng = random.Random(seed)
    products = _make_products(rng)
    goals: list[dict] = []
    seen: set[str] = set()
    seen_specs: set[tuple] = set()
    need = NUM_TRAIN + NUM_EVAL
    order = list(range(len(products)))
    while len(goals) < need:
        rng.shuffle(order)
        for i in order:
            goal = _make_goal(rng, products[i])
            # One goal per spec, the price cap aside: a reworded or re-priced copy of a goal would be the same
            # task in both splits (a train/eval leak) or a duplicate within one.
            if goal["instruction"] in seen or _spec(goal) in seen_specs:
                continue
            seen.add(goal["instruction"])
            seen_specs.add(_spec(goal))
            goals.append(goal)
            if len(goals) == need:
                break
    rng.shuffle(goals)
    splits = {"eval": goals[:NUM_EVAL], "train": goals[NUM_EVAL:]}
    out_goals: dict = {"version": 1}
    for split in ("train", "eval"):
        out_goals[split] = [{"id": f"{split}-{i:04d}", **g} for i, g in enumerate(splits[split])]
    for p in products:
        del p["noun"]
    return {"version": 1, "products": products}, out_goals


def _dump(obj: dict) -> bytes:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def write(out_dir: str | Path = DEFAULT_OUT, seed: int = DEFAULT_SEED) -> list[Path]:
    """Generate and write ``catalog.json.gz`` and ``goals.json.gz`` into ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    catalog, goals = generate(seed)
    paths = []
    for name, obj in (("catalog.json.gz", catalog), ("goals.json.gz", goals)):
        path = out / name
        path.write_bytes(_dump(obj))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    for path in write(args.out, args.seed):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

"""WebShop as the GiGPO paper's code runs it (``protocol="verl-agent"``).

Everything here follows the code the paper's numbers come from: princeton-nlp/WebShop as vendored in
langfengQ/verl-agent (``agent_system/environments/env_package/webshop/webshop/web_agent_site``: ``engine/goal.py``
for goals and reward, ``engine/normalize.py`` for the colour list, ``engine/engine.py`` for products, prices and
search, ``envs/web_agent_text_env.py`` + ``templates/*.html`` for pages and clickables,
``search_engine/convert_product_file_format.py`` for the search documents) and verl-agent's
``agent_system/environments/env_manager.py`` (``WebshopEnvironmentManager.format_obs`` / ``format_avail_actions``)
and ``env_package/webshop/envs.py`` (reward 10 × success, the [0:500] test / [500:] train split). The code here
is written anew; only the colour word list is reproduced as data. ``docs/paper_protocol.md`` lists
what is exact and what is a deviation by design.

Reward (:func:`paper_reward`, WebShop's ``get_reward``)
------------------------------------------------------
``score = r_type × (n_att + n_opt + r_price) / (len(goal attributes) + len(goal options) + 1)``:

- ``n_att``: goal attributes with a product ``Attributes`` entry of thefuzz ``token_set_ratio > 85``, else that occur
  as a plain substring of the lower-cased ``Title``, ``' '.join(BulletPoints)`` or ``Description``.
- ``n_opt``: goal options (a dict's *items*, i.e. ``(name, value)`` pairs, as ``get_reward`` passes them; or a list)
  with some purchased option value of ``token_set_ratio > 85``, both first through :func:`normalize_color`.
- ``r_price``: ``price <= price_upper`` (``price_upper <= 0`` → None, which ``get_reward`` then fails to add).
- ``r_type``: 1.0; 0.5 unless the ``query`` fields are equal, or ≥ 2 parts of the ``product_category`` paths
  (split on ``›``) are shared, or the title score > 0.2; then 0.1 if the title score < 0.1 and 0.0 if it is 0. The
  title score is |purchased ∩ desired| / len(desired) over the lower-cased NOUN/PROPN tokens of the two ``name``
  fields (0.2 when the desired name has none), tagged by ``nlp`` (spaCy ``en_core_web_sm`` in verl-agent's copy).

``token_set_ratio`` is thefuzz 0.22's: ``int(round(rapidfuzz.fuzz.token_set_ratio(p(s1), p(s2))))`` where ``p``
drops the code points 128-255 of ``str(s)`` and applies ``rapidfuzz.utils.default_process``; 0 when either is None.
thefuzz is that wrapper, so rapidfuzz (a core dependency) gives the same integers and thefuzz is not needed (the
tests compare both when thefuzz is installed).

Goals (:func:`synthetic_goals`, ``get_synthetic_goals``; ``human_goals=False`` as in verl-agent's config)
-------------------------------------------------------------------------------------------------------
One goal per product with an instruction and per combination of its option values (``itertools.product`` over the
sorted option names), instruction ``"{instruction} with {name}: {value}, and {name}: {value}, and price lower than
{P:.2f} dollars"``. ``P``: of the first four multiples of 10 (10..990) above the product's price, the larger of two
drawn by ``random.sample``; with fewer than two, 1,000,000 and no price text. A "$a to $b" product is priced once by
``random.uniform(a, b)``. Prices and caps come from ``random.Random(goal_seed)`` in the engine's order (all prices,
then one draw per product with an instruction); the goals are then shuffled by ``random.Random(233).shuffle``
(the paper's code before its 2025-06-03 update); ``test = goals[0:500]``, ``train = goals[500:]``.

Evaluation draw (:func:`paper_eval_goal_indices`, webshop ``envs.py`` ``reset``)
------------------------------------------------------------------------------
Each validation plays 128 distinct test goals: ``np.random.RandomState(env.seed + 1000).choice(range(500),
size=128, replace=False)``, a new draw of the same generator per validation round.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import namedtuple
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

PAPER_SPACY_MODEL = "en_core_web_sm"  # verl-agent's goal.py (princeton-nlp/WebShop before 2024-05: en_core_web_lg)
GOAL_SHUFFLE_SEED = 233
NUM_TEST_GOALS = 500
PAPER_VAL_SEED_OFFSET = 1000  # make_envs: validation envs get env.seed + 1000
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_CAP = 1000000
FUZZ_THRESHOLD = 85  # a match needs token_set_ratio > 85
SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
SUCCESS_REWARD = 10.0
SEARCH_ACTION = "search[<your query>]"
END_BUTTON, NEXT_PAGE, PREV_PAGE, BACK_TO_SEARCH = "buy now", "next >", "< prev", "back to search"
SUB_PAGES = ("description", "features", "reviews")  # item-page buttons to sub-pages ("attributes": show_attrs off)
NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")

# normalize.py COLOR_SET, in its order (the first contained word wins).
COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy camel "
    "camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral cranberry "
    "cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass gray green grey "
    "heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight "
    "mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple rainbow "
    "red rose royal rust sand sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal "
    "tiger turquoise violet walnut wheat white wine yellow"
).split()

_LATIN1 = {i: None for i in range(128, 256)}
_ACTION_RE = re.compile(r"(.+)\[(.+)\]")  # engine.py parse_action: re.match, greedy, not anchored at the end

Token = namedtuple("Token", ["text", "pos_"])


# --------------------------------------------------------------------------------------------------- reward
def normalize_color(option: Any) -> Any:
    """The first ``COLOR_SET`` word (in the list's order) ``in`` ``option``, else ``option`` unchanged
    (normalize.py ``normalize_color``). ``in`` is Python's: a substring test for a string ("navy blue" -> "blue",
    which precedes "navy"), an element test for a tuple (a goal option dict's ``(name, value)`` item)."""
    for color in COLOR_SET:
        if color in option:
            return color
    return option


def token_set_ratio(s1: Any, s2: Any) -> int:
    """thefuzz 0.22 ``fuzz.token_set_ratio(s1, s2)``: an int in [0, 100]; 0 when either is None. Non-strings are
    compared as ``str(x)`` (a tuple as ``"('color', 'red')"``)."""
    from rapidfuzz.fuzz import token_set_ratio as _ratio
    from rapidfuzz.utils import default_process

    if s1 is None or s2 is None:
        return 0
    return int(round(_ratio(default_process(str(s1).translate(_LATIN1)), default_process(str(s2).translate(_LATIN1)))))


_SPACY: dict[str, Any] = {}


def load_spacy(model: str = PAPER_SPACY_MODEL) -> Callable:
    """spaCy's ``model`` pipeline (cached), the POS tagger of the type reward. Raises ``ImportError`` with the
    install command when spaCy or the model is missing."""
    if model not in _SPACY:
        hint = (f"pip install 'gigpo_trl[webshop-paper]' && python -m spacy download {model} (or pass nlp=, a "
                "callable returning tokens with .text and .pos_)")
        try:
            import spacy
        except ImportError:
            raise ImportError(f"WebShop's type reward needs spaCy's {model} POS tagger: {hint}") from None
        try:
            _SPACY[model] = spacy.load(model)
        except OSError:
            raise ImportError(f"spaCy model {model!r} is not installed: {hint}") from None
    return _SPACY[model]


class LexiconTagger:
    """A POS "tagger" from a word list: words (``[0-9a-z]+`` runs of the lower-cased text, keeping ``'``/``-``
    inside words) in ``nouns`` are ``NOUN``, others ``X``. The bundled catalog's stand-in for spaCy: its titles are
    made from product-type, category and brand words, which are its nouns."""

    def __init__(self, nouns):
        self.nouns = frozenset(str(n).lower() for n in nouns)

    def __call__(self, text: str) -> list[Token]:
        return [Token(w, "NOUN" if w.lower() in self.nouns else "X")
                for w in re.findall(r"[0-9A-Za-z]+(?:['-][0-9A-Za-z]+)*", str(text))]


def type_reward(purchased_product: dict, goal: dict, nlp: Callable) -> dict:
    """goal.py ``get_type_reward``: ``{"r_type", "query_match", "category_match", "title_score"}``."""
    query_match = purchased_product["query"] == goal["query"]
    purchased_cat = {x.strip() for x in purchased_product["product_category"].split("›")}
    goal_cat = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(purchased_cat & goal_cat) >= 2
    purchased_nouns = [t.text.lower() for t in nlp(purchased_product["name"]) if t.pos_ in NOUN_TAGS]
    desired_nouns = [t.text.lower() for t in nlp(goal["name"]) if t.pos_ in NOUN_TAGS]
    if not desired_nouns:
        title_score = 0.2
    else:
        title_score = len(set(purchased_nouns) & set(desired_nouns)) / len(desired_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def attribute_matches(purchased_product: dict, goal_attributes: list) -> int:
    """goal.py ``get_attribute_reward``'s count: goal attributes matched by fuzzy attribute or text substring."""
    text = (purchased_product["Title"].lower(), " ".join(purchased_product["BulletPoints"]).lower(),
            purchased_product["Description"].lower())
    n = 0
    for g_attr in goal_attributes:
        if any(token_set_ratio(p_attr, g_attr) > FUZZ_THRESHOLD for p_attr in purchased_product["Attributes"]):
            n += 1
        elif any(g_attr in t for t in text):
            n += 1
    return n


def option_matches(purchased_options: list, goal_options: Any) -> int:
    """goal.py ``get_option_reward``'s count: goal options (after :func:`normalize_color`) with a purchased option
    (after it too) of ``token_set_ratio > 85``."""
    purchased = [normalize_color(o) for o in purchased_options]
    n = 0
    for g_option in (normalize_color(o) for o in goal_options):
        if any(token_set_ratio(p, g_option) > FUZZ_THRESHOLD for p in purchased):
            n += 1
    return n


def paper_reward(purchased_product: dict, goal: dict, price: float, options: dict, nlp: Callable | None = None,
                 verbose: bool = False):
    """WebShop's purchase score in [0, 1], as ``web_agent_site/engine/goal.py`` ``get_reward`` computes it.

    Args:
        purchased_product: WebShop's product dict: ``Attributes`` (list of str), ``Title``, ``BulletPoints`` (list
            of str), ``Description``, ``query``, ``name``, ``product_category`` ("A › B › C").
        goal: ``attributes`` (non-empty list of str), ``goal_options`` (dict name -> value, whose *items* are
            matched, or a list of values), ``price_upper``, ``query``, ``name``, ``product_category``.
        price: the product's price in dollars (engine.py: a "$a to $b" product is priced by ``random.uniform``).
        options: the options selected before buying, dict name -> value.
        nlp: POS tagger for the type reward: ``nlp(text)`` -> tokens with ``.text`` and ``.pos_``. None: spaCy's
            ``en_core_web_sm`` (:func:`load_spacy`; ImportError with the install command when missing).
        verbose: also return ``get_reward``'s info dict (r_type, r_att, query_match, category_match,
            title_score, and r_option / r_price with their weights where defined).

    Returns:
        The score (float), or ``(score, info)`` with ``verbose``.

    Raises:
        ValueError: ``goal["attributes"]`` is empty (``get_reward`` divides by its length), or
            ``goal["price_upper"] <= 0`` (``get_reward`` then adds None and fails).
    """
    goal_attrs = goal["attributes"]
    if not goal_attrs:
        raise ValueError(f"goal {goal.get('asin', '')!r} has no attributes; WebShop's get_reward divides by "
                         "len(goal['attributes']) (its synthetic goals always have some)")
    if not goal["price_upper"] > 0:
        raise ValueError(f"goal price_upper={goal['price_upper']!r}: WebShop's get_reward needs a positive cap")
    nlp = load_spacy() if nlp is None else nlp
    r_type = type_reward(purchased_product, goal, nlp)
    r_price = price <= goal["price_upper"]
    n_att = attribute_matches(purchased_product, goal_attrs)
    goal_options = goal["goal_options"]
    goal_option_list = list(goal_options.items()) if isinstance(goal_options, dict) else list(goal_options)
    n_opt = option_matches(list(options.values()), goal_option_list)
    denominator = len(goal_attrs) + len(goal_options) + 1
    total = (n_att + n_opt + r_price) / denominator * r_type["r_type"]
    if not verbose:
        return total
    info = {"r_type": r_type["r_type"], "r_att": n_att / len(goal_attrs), "w_att": len(goal_attrs) / denominator,
            "query_match": r_type["query_match"], "category_match": r_type["category_match"],
            "title_score": r_type["title_score"]}
    if goal_option_list:
        info["r_option"] = n_opt / len(goal_option_list)
        info["w_option"] = len(goal_options) / denominator
    info["r_price"] = r_price
    info["w_price"] = 1 / denominator
    return total, info


# ----------------------------------------------------------------------------------------------- products
def parse_pricing(pricing: Any) -> tuple[list[float], str]:
    """engine.py ``load_products``: ``(pricing, price_tag)``; "$12.99" -> ([12.99], "$12.99"), "$10.99 - $15.99"
    -> ([10.99, 15.99], "$10.99 to $15.99"), missing -> ([100.0], "$100.0"). Raises ``ValueError`` naming the
    text when a "$" part has no number."""
    if not pricing:
        return [100.0], "$100.0"
    try:
        values = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in str(pricing).split("$")[1:]]
    except InvalidOperation:
        raise ValueError(f"WebShop pricing {pricing!r}: expected '$12.99' or '$10.99 - $15.99'") from None
    if not values:
        return [100.0], "$100.0"  # no "$": engine.py would give an empty list and fail later; priced as missing
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def paper_product(raw: dict, attributes: dict) -> dict:
    """One product of ``items_shuffle*.json`` in the engine's shape (engine.py ``load_products``): ``asin``,
    ``name``, ``Title``, ``Description``, ``BulletPoints``, ``Attributes`` (``items_ins_v2``'s ``attributes``, else
    ``["DUMMY_ATTR"]``), ``query`` (lower-cased, stripped), ``category``, ``product_category``, ``pricing``,
    ``Price`` (the page's price text), ``options`` (name -> values, lower-cased, "/" shown as " | "),
    ``Rating`` ("N.A.": the paper's code loads no reviews), ``instruction_text`` / ``instruction_attributes``."""
    asin = raw["asin"]
    pricing, price_tag = parse_pricing(raw.get("pricing"))
    options = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents is None:
            continue
        options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    small = raw.get("small_description")
    entry = attributes.get(asin) or {}
    return {
        "asin": asin, "name": raw["name"], "Title": raw["name"], "Description": raw.get("full_description") or "",
        "BulletPoints": small if isinstance(small, list) else [small],
        "Attributes": entry["attributes"] if "attributes" in entry else ["DUMMY_ATTR"],
        "query": str(raw.get("query") or "").lower().strip(), "category": raw.get("category", ""),
        "product_category": raw.get("product_category") or "", "pricing": pricing, "Price": price_tag,
        "options": options, "Rating": "N.A.",
        "instruction_text": entry.get("instruction"), "instruction_attributes": entry.get("instruction_attributes"),
    }


def paper_products(raw_products: list, attributes: dict) -> list[dict]:
    """engine.py ``load_products``: skip asins ``"nan"`` or longer than 10 characters and repeated asins."""
    out, seen = [], set()
    for raw in raw_products:
        asin = raw.get("asin") if isinstance(raw, dict) else None
        if not isinstance(asin, str):
            raise ValueError(f"every WebShop product must be a dict with a string 'asin'; got {str(raw)[:80]!r}")
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        out.append(paper_product(raw, attributes))
    return out


def product_prices(products: list[dict], rng: random.Random) -> dict[str, float]:
    """engine.py ``generate_product_prices``: one price per product; a range is priced by ``rng.uniform(a, b)``."""
    prices = {}
    for p in products:
        pricing = p["pricing"]
        prices[p["asin"]] = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    return prices


def price_cap(price: float, rng: random.Random) -> tuple[float, str]:
    """``(price_upper, price_text)`` of a goal (goal.py): the larger of two ``rng.sample`` picks among the first
    four multiples of 10 above ``price``; ``(1000000, "")`` when fewer than two exist."""
    price_range = [p for p in PRICE_RANGE if p > price][:4]
    if len(price_range) < 2:
        return NO_PRICE_CAP, ""
    _, upper = sorted(rng.sample(price_range, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def synthetic_goals(products: list[dict], prices: dict[str, float], rng: random.Random) -> list[dict]:
    """goal.py ``get_synthetic_goals``: per product with an ``instruction_text``, one goal per option combination
    (see the module doc); the price cap is drawn once per product, before its combinations."""
    goals = []
    for product in products:
        if product.get("instruction_text") is None:
            continue
        attributes = product["instruction_attributes"]
        if not attributes:
            raise ValueError(f"product {product['asin']}: an instruction without instruction_attributes (WebShop's "
                             "synthetic goals assert at least one)")
        upper, price_text = price_cap(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"], "category": product["category"], "query": product["query"],
                "name": product["Title"], "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": attributes, "price_upper": upper, "goal_options": goal_options,
            })
    return goals


def split_goals(goals: list[dict]) -> dict[str, list[dict]]:
    """Shuffle with ``random.Random(233)`` (SimServer before verl-agent's 2025-06-03 update) and split
    ``test = [0:500]``, ``train = [500:]`` (verl-agent webshop ``envs.py``). Goals get ``id`` = ``goal-<index>`` in
    the shuffled list; the input list is not modified."""
    goals = list(goals)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    goals = [{**g, "id": f"goal-{i:05d}"} for i, g in enumerate(goals)]
    return {"eval": goals[:NUM_TEST_GOALS], "train": goals[NUM_TEST_GOALS:]}


def paper_eval_goal_indices(num_episodes: int = 128, seed: int = 0, eval_round: int = 0,
                            num_test_goals: int = NUM_TEST_GOALS) -> list[int]:
    """Indices into the test goals (``goals[0:500]``) of verl-agent's WebShop validation ``eval_round``
    (0 = the validation before training), one per episode, in worker order.

    verl-agent before its 2025-06-03 update (commit f974dc5; HEAD draws the same way): ``make_envs``
    (``env_manager.py``) builds the validation env with ``seed = env.seed + PAPER_VAL_SEED_OFFSET``,
    ``env_num = data.val_batch_size`` (128) and ``group_n = 1``; ``WebshopMultiProcessEnv`` (webshop ``envs.py``)
    holds ``np.random.RandomState(seed)``, its test ``goal_idxs = range(500)``, and each ``reset()`` draws
    ``rng.choice(goal_idxs, size=env_num, replace=False)``, worker ``i`` playing the ``i``-th index
    (``np.repeat(idx, group_n)``). A validation calls ``reset()`` once (128 validation rows = one batch of 128), and
    this generator serves nothing else, so round ``r`` is its ``(r + 1)``-th draw, for every round exactly.
    (Legacy ``RandomState.choice`` without replacement or weights is ``permutation(len(goal_idxs))[:size]``.)

    The workers' own seeds (``seed + i // group_n``) do not enter: in f974dc5 the worker ignores its seed
    (``# env_kwargs['seed'] = seed``) and every worker's goal list is the same ``random.seed(233)`` shuffle, so an
    index names the same goal on every worker. (At HEAD each worker shuffles with its own seed, so one index names a
    different goal per worker; not reproduced, the paper's numbers predate it.)

    Args:
        num_episodes: ``val_data_size`` (128); at most ``num_test_goals`` (the draw is without replacement).
        seed: the run's ``env.seed`` (0 in the paper's scripts); the validation generator is ``seed + 1000``.
        eval_round: which validation (``ceil(iterations / test_freq)`` after ``iterations`` iterations).
        num_test_goals: size of the pool drawn from (500 in the paper; the bundled catalog has fewer test goals).

    Raises:
        ValueError: ``num_episodes`` < 1 or > ``num_test_goals``, or ``eval_round`` < 0.
    """
    import numpy as np

    if not 1 <= num_episodes <= num_test_goals or eval_round < 0:
        raise ValueError(f"need 1 <= num_episodes <= num_test_goals and eval_round >= 0; got num_episodes="
                         f"{num_episodes}, num_test_goals={num_test_goals}, eval_round={eval_round}")
    rng = np.random.RandomState(int(seed) + PAPER_VAL_SEED_OFFSET)
    pool = range(int(num_test_goals))
    for _ in range(eval_round):
        rng.choice(pool, size=num_episodes, replace=False)
    return [int(i) for i in rng.choice(pool, size=num_episodes, replace=False)]


def search_document(product: dict) -> str:
    """The text a product is indexed by (convert_product_file_format.py): title, description, first bullet point
    and ``"name: v1, v2, and name: ..."`` options, lower-cased. Not the product's attribute list."""
    option_text = ", and ".join(f"{n}: {', '.join(v)}" for n, v in product["options"].items())
    first_bullet = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return " ".join([product["Title"], product["Description"], first_bullet or "", option_text]).lower()


# ----------------------------------------------------------------------------------------------- pages
def _visible(text: str) -> str | None:
    """One text node of the page as ``convert_html_to_text(simple=True)`` keeps it: stripped; an empty node is
    absent, a whitespace-only one is absent when it holds a newline (html.parser folds it to "\\n"), else ""."""
    if text == "" or (not text.strip() and "\n" in text):
        return None
    return text.strip()


def page_parts(page: str, products: list[dict] | None = None, product: dict | None = None, page_no: int = 1,
               total: int = 0) -> list[str]:
    """The text parts of a page after its instruction (``format_obs`` drops everything up to the instruction).

    ``page``: "search", "results" (``products`` of this page, ``page_no``, ``total``), "item", "description",
    "features", "reviews" (``product``). The parts follow templates/*.html."""
    if page == "search":
        raw = ["Search"]
    elif page == "results":
        raw = ["Back to Search", f"Page {page_no} (Total results: {total})"]
        raw += ["< Prev", "Next >"] if page_no > 1 else ["Next >"]
        for p in products or []:
            raw += [p["asin"], p["Title"], p["Price"]]
    else:
        raw = ["Back to Search", "< Prev"]
        if page == "item":
            for name, values in product["options"].items():
                raw += [name, *values]
            raw += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}", "Description",
                    "Features", "Reviews", "Buy Now"]
        elif page == "description":
            raw.append(product["Description"])
        elif page == "features":
            raw += [" " + str(b) for b in product["BulletPoints"]]
        elif page != "reviews":  # reviews: none loaded in the paper's code
            raise ValueError(f"unknown WebShop page {page!r}")
    return [v for v in (_visible(str(t)) for t in raw) if v is not None]


def format_observation(parts: list[str]) -> str:
    """verl-agent ``format_obs``: every part quoted, joined by " [SEP] "."""
    return " [SEP] ".join(f"'{p}'" for p in parts)


def clickables(page: str, products: list[dict] | None = None, product: dict | None = None,
               page_no: int = 1) -> dict[str, tuple]:
    """``text_to_clickable`` of a page (web_agent_text_env.py ``get_available_actions``): lower-cased button texts,
    then product links (lower-cased asins), then option values (radio inputs), in page order, as a dict (a later
    element with the same text replaces the earlier one but keeps its place). Values: ``("button",)``,
    ``("product", asin)``, ``("option", name)``."""
    out: dict[str, tuple] = {}
    if page == "search":
        out["search"] = ("button",)
    elif page == "results":
        for b in ([BACK_TO_SEARCH, PREV_PAGE, NEXT_PAGE] if page_no > 1 else [BACK_TO_SEARCH, NEXT_PAGE]):
            out[b] = ("button",)
        for p in products or []:
            out[p["asin"].lower()] = ("product", p["asin"])
    else:
        out[BACK_TO_SEARCH] = ("button",)
        out[PREV_PAGE] = ("button",)
        if page == "item":
            for b in (*SUB_PAGES, END_BUTTON):
                out[b] = ("button",)
            for name, values in product["options"].items():
                for v in values:
                    out[str(v)] = ("option", name)
    return out


def available_actions(page: str, clickable: dict) -> list[str]:
    """verl-agent ``format_avail_actions``: ``search[<your query>]`` when the page has the search bar, then
    ``click[x]`` for every clickable."""
    return ([SEARCH_ACTION] if page == "search" else []) + [f"click[{c}]" for c in clickable]


def parse_action(action: str) -> tuple[str, str | None]:
    """engine.py ``parse_action``: ``("search", "red shirt")`` for ``"search[red shirt]"``; ``(action, None)``
    when there is no ``name[arg]``."""
    m = _ACTION_RE.match(action)
    return (action, None) if m is None else (m.group(1), m.group(2))

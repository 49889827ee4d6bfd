"""WebShop as the GiGPO paper's code runs it (``protocol="verl-agent"``): :class:`PaperWebShopEnv`.

The engine's goals, reward, pages and search are :mod:`gigpo_trl.envs.verl_agent.webshop_engine`; this module holds
the data sources in the engine's shapes (:func:`load_paper_dir`, :func:`paper_bundled`, their cached stores) and the
environment.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..webshop.data import _INS_EXPECTED, _PRODUCTS_EXPECTED, _read_json, load_bundled
from ..webshop.env import WebShopEnv
from ..webshop.search import _get_store, tokenize
from . import webshop_engine as paper
from .base import PaperProtocol

# Our wording of the paper's two WebShop templates (same structure as verl-agent's prompts/webshop.py: task, steps
# taken, history block, current step, page, the bracketed admissible list one action a line; placeholders in
# .prompts.VERL_AGENT_PLACEHOLDERS). Unlike ALFWorld's, the first-step template carries the task: the
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


class _PaperStore:
    """Products (engine shape), their prices, goal splits, POS tagger and BM25 index of one data source (see
    :mod:`gigpo_trl.envs.verl_agent.webshop_engine`)."""

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
    :class:`~gigpo_trl.envs.verl_agent.webshop_engine.LexiconTagger` of its product-type, category and brand words."""
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
    """The (cached) paper store of a data source (as :func:`gigpo_trl.envs.webshop.search.get_store`). ``nlp``: the type
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


class PaperWebShopEnv(PaperProtocol, WebShopEnv):
    """WebShop as the GiGPO paper's code runs it (``make_env("webshop", protocol="verl-agent")``); see
    :mod:`gigpo_trl.envs.verl_agent.webshop_engine` for goals, reward, pages and sources.

    Observations are verl-agent's ``format_obs`` of the page: its text parts after the instruction, each quoted,
    joined by `` [SEP] `` (``'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] 'Next >' [SEP] ...``).
    ``info["admissible_actions"]`` is ``format_avail_actions``: ``search[<your query>]`` on the search page, then
    ``click[x]`` for every clickable (buttons, product ids, option values). ``search[q]`` works from any page;
    ``click[x]`` with ``x`` (lower-cased) a clickable of the page other than ``search`` acts; anything else leaves the
    page as it is (reward 0, not done). The paper never checks admissibility, so ``info["action_valid"]`` is always
    True (``info["action_executed"]`` says whether the action did something). ``click[buy now]`` ends the episode:
    ``info["task_score"]`` = :func:`~gigpo_trl.envs.verl_agent.webshop_engine.paper_reward`, reward 10 if it is 1.0
    else 0, ``info["won"]``.

    Args:
        data_dir, variant, split: as :class:`WebShopEnv` (``split`` "eval"/"test" = goals[0:500] on real data).
        nlp: POS tagger of the type reward (``nlp(text)`` -> tokens with ``.text``, ``.pos_``). None: the bundled
            catalog's lexicon tagger, or spaCy ``en_core_web_sm`` for real data (loaded at construction; ImportError
            with the install command when missing).
        goal_seed: seed of the prices and price caps of the real data's synthetic goals (default 233).
        prompt_template, first_prompt_template: the later-step and first-step user-message templates, verbatim
            (placeholders of :data:`gigpo_trl.envs.verl_agent.prompts.VERL_AGENT_PLACEHOLDERS`); default: our wording,
            ``VERL_AGENT_TEMPLATE`` / ``VERL_AGENT_FIRST_TEMPLATE``.

    Prompts (:func:`~gigpo_trl.envs.verl_agent.prompts.build_verl_agent_prompt`): one user message; the admissible
    list one quoted action a line, each followed by a comma (``admissible_style = "webshop"``); a prompt with history
    longer than ``max_prompt_chars`` (13,000, verl-agent's rule) is replaced by the first-step one.
    """

    default_template = VERL_AGENT_TEMPLATE
    default_first_template = VERL_AGENT_FIRST_TEMPLATE
    admissible_style = "webshop"
    max_prompt_chars = VERL_AGENT_MAX_PROMPT_CHARS

    def __init__(self, data_dir: str | Path | None = None, variant: str = "1000", split: str = "train",
                 nlp=None, goal_seed: int = paper.GOAL_SHUFFLE_SEED,
                 prompt_template: str | None = None, first_prompt_template: str | None = None):
        self.init_templates(prompt_template, first_prompt_template)
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
        :func:`~gigpo_trl.envs.verl_agent.webshop_engine.paper_eval_goal_indices` ``(num_episodes, seed,
        eval_round)``, 128 distinct goals of the 500 per round with the paper's defaults. On real data this is
        verl-agent's draw exactly; the bundled catalog has 200 test goals, so there the same generator draws from
        ``range(200)``. Sample them at temperature 0.4 to match the paper.

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
            return float(paper.paper_reward(product, self.goal, self.store.prices[self._asin], self._options,
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


__all__ = ["PaperWebShopEnv", "VERL_AGENT_FIRST_TEMPLATE", "VERL_AGENT_MAX_PROMPT_CHARS", "VERL_AGENT_TEMPLATE",
           "get_paper_store", "load_paper_dir", "paper_bundled"]

"""The WebShop environment (``protocol="gigpo-trl"``): pages, actions and the episode.

Pages and actions
-----------------
The agent shops on four kinds of pages, rendered as text with ``[SEP]`` separators; every page starts
with ``WebShop [SEP] Instruction: [SEP] <instruction> [SEP]``:

- search page: ``... [SEP] Search``; the only action is ``search[<query>]``.
- results page: ``Back to Search [SEP] Page 2 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP]
  B0... [SEP] <title> [SEP] $12.99 [SEP] ...``; 10 results per page out of the top 50 of a BM25 search.
- item page: ``Back to Search [SEP] < Prev [SEP] <group> [SEP] <value> [SEP] ... [SEP] <title> [SEP]
  Price: $x [SEP] Rating: y [SEP] Description [SEP] Features [SEP] Buy Now``; a ``Selected options: none`` segment
  follows the option groups, ``Selected options: size: large, color: red`` once options are chosen.
- description / features sub-pages: ``Back to Search [SEP] < Prev [SEP] <text>``.

Actions are ``search[query]`` and ``click[x]`` where ``x`` is one of the page's clickables: ``back to
search``, ``next >``, ``< prev`` (to the previous results page, from an item back to the results, from a
sub-page back to the item), a product id on the current results page, an option value, ``description``,
``features``, ``buy now``. ``info["admissible_actions"]`` lists ``search[<your query>]`` when the search
bar is shown, else ``click[...]`` for every clickable, lowercase as in WebShop. Matching ignores case and
extra whitespace (``click[ Next> ]`` works). Anything else (unknown verb, malformed text, a click on
something not on the page, an empty search, ``WebShopEnv.invalid_action``) is invalid: the observation is
unchanged, the reward 0, the episode goes on and ``info["action_valid"]`` is ``False``.

The score of a purchase is :func:`gigpo_trl.envs.webshop.scoring.webshop_score`; data sources are in
:mod:`gigpo_trl.envs.webshop.data`, the search in :mod:`gigpo_trl.envs.webshop.search`.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..base import TextEnv
from .data import _PRICE_CLAUSE
from .scoring import normalize, webshop_score
from .search import get_store

RESULTS_PER_PAGE = 10
SUCCESS_REWARD = 10.0
SEARCH_PLACEHOLDER = "search[<your query>]"
_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.I | re.S)

# Short on purpose: every token of these is prefilled on every turn and trained on in every row (WebShop's prompts
# are 200-870 tokens; these two cost ~110 of them, the former wording ~230: 20 % of an expert episode's tokens).
SYSTEM_PROMPT = (
    "You shop in WebShop, a text store whose pages list items separated by [SEP]. Each turn, write "
    "<think>...</think> then one action in <action>...</action>: search[query] where the page shows Search, "
    "or click[item] for something clickable on the page."
)

PROMPT_TEMPLATE = (
    "Task: {instruction}\n"
    "{history}"
    "Step {turn} of {max_turns}. Page:\n{observation}\n"
    "{admissible_actions}"
    "Buy a product that meets every requirement: click each requested option, then click[buy now]."
)


def _click_key(text: str) -> str:
    return " ".join(str(text).lower().split())


def _fmt_price(price: float) -> str:
    return f"${price:.2f}"


class WebShopEnv(TextEnv):
    """WebShop text environment (see the module doc for pages, actions, reward and data).

    Args:
        data_dir: directory with the real WebShop files, ``"bundled"``, or None (``WEBSHOP_DATA`` if set,
            else the bundled catalog).
        variant: ``"1000"`` or ``"full"``: which real WebShop file set to read from ``data_dir``.
        split: the split an int ``task`` passed to ``reset`` indexes into (goal id strings work for any).
        prompt_template: the user-message template, verbatim, with the placeholders of ``DEFAULT_PROMPT_TEMPLATE``
            (default: this env's own wording).

    Every step's ``info["task_score"]`` is the WebShop score of the purchase (0.0 until something is bought).
    Instances pickle without their data (the unpickled copy fetches the cached store of the same source).
    """

    name = "webshop"
    max_turns = 15
    system_prompt = SYSTEM_PROMPT
    prompt_template = PROMPT_TEMPLATE
    invalid_action = "<invalid action>"

    def __init__(self, data_dir: str | Path | None = None, variant: str = "1000", split: str = "train",
                 prompt_template: str | None = None):
        if prompt_template is not None:
            self.prompt_template = prompt_template
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
            raise RuntimeError(f"{type(self).__name__}.step called before reset")
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
                chosen = ", ".join(f"{g}: {v}" for g, v in self._selected.items())
                parts.append(f"Selected options: {chosen or 'none'}")
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
        highest-ranked result that would score best if bought with the goal's options, clicks the goal's options
        that product offers, and buys. Among equally good results it takes the first, not the goal's own product:
        on the bundled catalog that is the first result in 69 % of the training goals and one of the first two in
        87 % (the goal's own product: 39 % and 58 %), so a policy that imitates it can mostly act on what the page
        shows."""
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
        chosen = {_click_key(v) for v in self._selected.values()}
        return next((f"click[{key}]" for key in self._wanted_options() if key not in chosen), "click[buy now]")

    def expert_thought(self, action: str) -> str:
        """The warm-up's thought for ``action`` (:meth:`expert_action` in this state), in a few words. On a product
        page it is the expert's own comparison, written out before the click: the task's options that this product
        offers, in the order the task names them, the selected ones (as the page's ``Selected options`` shows them),
        and the next click (``task options: navy blue, 15.6 inch. selected: navy blue. next: 15.6 inch``, ``... next:
        buy``); "" once the episode is over."""
        if self.goal is None or self._done:
            return ""
        if self._page == "search":
            return "search the task"
        if self._page == "results":
            if action == "click[back to search]":
                return "no results: search again"
            if action in ("click[next >]", "click[< prev]"):
                return "the best match is on another page"
            return "open the highest-ranked result that fits the task"
        if self._page == "item":
            # the expert's comparison, written out: the task's options this product offers (task order), the ones
            # selected so far (the page's "Selected options"), then the next click
            wanted = self._wanted_options()
            chosen = [_click_key(v) for v in self._selected.values()]
            step = "buy" if action == "click[buy now]" else action[len("click["):-1]
            return (f"task options: {', '.join(wanted) or 'none'}. selected: {', '.join(chosen) or 'none'}. "
                    f"next: {step}")
        return "back to the product"

    def _wanted_options(self) -> list[str]:
        """The goal's options that the current product offers, as click keys, in the order the task names them."""
        product = self.store.products[self._item]
        offered = {_click_key(v) for values in product["options"].values() for v in values}
        return [key for key in map(_click_key, self._options_in_task_order()) if key in offered]

    def _options_in_task_order(self) -> list[str]:
        """The goal's options in the order the instruction names them (unnamed ones last), so that the expert's
        next option is always the first one the task text asks for that is not selected yet."""
        text = f" {normalize(self.goal['instruction'])} "
        def position(opt: str) -> int:
            at = text.find(f" {normalize(opt)} ")
            return at if at >= 0 else len(text)
        return sorted(self.goal["options"], key=position)

    def _achievable(self, idx: int) -> float:
        """The score of buying product ``idx`` with the goal's options it offers."""
        product = self.store.products[idx]
        offered = {normalize(v): v for values in product["options"].values() for v in values}
        opts = [offered[normalize(o)] for o in self.goal["options"] if normalize(o) in offered]
        return webshop_score(self.goal, product, opts)


__all__ = ["PROMPT_TEMPLATE", "RESULTS_PER_PAGE", "SEARCH_PLACEHOLDER", "SUCCESS_REWARD", "SYSTEM_PROMPT", "WebShopEnv"]

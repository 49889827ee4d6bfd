"""Tests of the WebShop text environment (gigpo_trl/envs/webshop/) and its bundled catalog."""

from __future__ import annotations

import gzip
import importlib.util
import json
import time
from pathlib import Path

import pytest

from gigpo_trl.envs import check_env
from gigpo_trl.envs.webshop import (
    BUNDLED_DIR,
    SUCCESS_REWARD,
    WebShopEnv,
    attribute_matched,
    get_store,
    goal_spec,
    load_bundled,
    normalize,
    webshop_score,
)
from gigpo_trl.envs.webshop.data import _split_goals
from gigpo_trl.envs.webshop.search import _Store

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_webshop_env_var(monkeypatch):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)


@pytest.fixture(scope="module")
def env():
    return WebShopEnv()


def run_expert(env, task, seed=0, max_steps=15):
    obs, info = env.reset(task, seed)
    reward, done, steps = 0.0, False, 0
    while not done and steps < max_steps:
        obs, reward, done, info = env.step(env.expert_action())
        assert info["action_valid"]
        steps += 1
    return reward, info


# ---------------------------------------------------------------------------------------------- reward
GOAL = {
    "attributes": ["sulfate free", "for dry hair"],
    "options": ["12 fl oz"],
    "price_upper": 30.0,
    "product_type": "shampoo",
    "category": "Beauty & Personal Care › Hair Care › shampoo",
    "top": "Beauty & Personal Care",
}


def make_product(**overrides):
    product = {
        "asin": "B0TEST0001",
        "title": "Acme Daily Shampoo",
        "product_type": "shampoo",
        "category": "Beauty & Personal Care › Hair Care › shampoo",
        "top": "Beauty & Personal Care",
        "price": 19.99,
        "attributes": ["sulfate free", "for dry hair", "argan oil"],
        "options": {"size": ["8 fl oz", "12 fl oz"]},
        "description": "A gentle shampoo.",
        "features": ["Gentle formula"],
    }
    product.update(overrides)
    return product


def test_reward_all_matched_is_one():
    assert webshop_score(GOAL, make_product(), {"size": "12 fl oz"}) == 1.0


def test_reward_three_of_four():
    # option not selected: (2 attrs + 0 options + price) / (2 + 1 + 1)
    assert webshop_score(GOAL, make_product(), {}) == 0.75
    # wrong option selected
    assert webshop_score(GOAL, make_product(), {"size": "8 fl oz"}) == 0.75
    # over budget
    assert webshop_score(GOAL, make_product(price=35.0), {"size": "12 fl oz"}) == 0.75
    # one attribute missing
    assert webshop_score(GOAL, make_product(attributes=["sulfate free"]), ["12 fl oz"]) == 0.75
    # two of four
    assert webshop_score(GOAL, make_product(attributes=["argan oil"]), {"size": "12 fl oz"}) == 0.5


def test_reward_type_factor():
    lipstick = make_product(product_type="lipstick",
                            category="Beauty & Personal Care › Makeup › lipstick")
    assert webshop_score(GOAL, lipstick, {"size": "12 fl oz"}) == 0.5  # same top-level category
    assert webshop_score(GOAL, lipstick, {}) == 0.5 * 0.75
    phones = make_product(product_type="headphones", category="Electronics › Headphones › headphones",
                          top="Electronics")
    assert webshop_score(GOAL, phones, {"size": "12 fl oz"}) == pytest.approx(0.1)
    # same full category path counts as the same type
    same_path = make_product(product_type="clarifying shampoo")
    assert webshop_score(GOAL, same_path, {"size": "12 fl oz"}) == 1.0


def test_attribute_matching_rules():
    p = make_product(attributes=["Sulfate-Free", "dry hair for"])
    assert attribute_matched("sulfate free", p)  # normalised exact
    assert attribute_matched("for dry hair", p)  # token order (fuzzy >= 85)
    assert not attribute_matched("paraben free", p)
    p2 = make_product(attributes=[], features=["Made with tea tree oil"])
    assert attribute_matched("tea tree oil", p2)  # phrase in product text
    # whole words only
    assert not attribute_matched("tea", make_product(attributes=[], title="Steady Shampoo"))


def test_distinct_catalog_attributes_do_not_match_each_other(env):
    attrs = sorted({a for p in env.store.products for a in p["attributes"]})
    for a in attrs:
        for b in attrs:
            if a != b:
                bare = {"attributes": [b], "title": "", "description": "", "features": []}
                assert not attribute_matched(a, bare), (a, b)


def test_env_reward_partial_and_full(env):
    # eval-0004 asks for 1 attribute and 2 options (color, size).
    goal = env.store.goal_by_id["eval-0004"]
    assert len(goal["attributes"]) == 1 and len(goal["options"]) == 2
    target = env.store.products[env.store.by_asin[goal["asin"].lower()]]

    def buy(options):
        env.reset("eval-0004", 0)
        env.step(f"search[{target['title']}]")
        assert target["asin"] in env._obs  # the title query ranks the product on page 1
        env.step(f"click[{target['asin']}]")
        for opt in options:
            assert env.step(f"click[{opt}]")[3]["action_valid"]
        return env.step("click[buy now]")

    obs, reward, done, info = buy([])
    assert (reward, done, info["task_score"], info["won"]) == (0.0, True, 0.5, False)
    obs, reward, done, info = buy(goal["options"][:1])
    assert (reward, info["task_score"], info["won"]) == (0.0, 0.75, False)
    obs, reward, done, info = buy(goal["options"])
    assert (reward, info["task_score"], info["won"]) == (SUCCESS_REWARD, 1.0, True)
    assert info["purchased_asin"] == target["asin"]


# ---------------------------------------------------------------------------------------------- expert
def test_expert_on_eval_split(env):
    scores, rewards = [], []
    for task in env.tasks("eval")["task"]:
        reward, info = run_expert(env, task)
        scores.append(info.get("task_score", 0.0))
        rewards.append(reward / SUCCESS_REWARD)
    assert len(scores) >= 200
    assert sum(scores) / len(scores) >= 0.9  # mean task_score
    assert sum(rewards) / len(rewards) >= 0.9  # mean reward / 10


def test_expert_takes_the_first_result_that_scores_best(env):
    # eval-0000: the goal's own product B0UGK82UB3 is the 3rd result, but the 1st (B0PAXUXLW4) scores 1.0 with the
    # goal's options too; the expert clicks the 1st, buys it and wins (a policy can imitate "the first result").
    env.reset("eval-0000")
    env.step(env.expert_action())
    asins = [env.store.products[i]["asin"] for i in env._results[:3]]
    assert asins[0] == "B0PAXUXLW4" and asins[2] == env.goal["asin"] == "B0UGK82UB3"
    assert env.expert_action() == "click[b0paxuxlw4]"
    reward, info = run_expert(env, "eval-0000")
    assert reward == SUCCESS_REWARD and info["purchased_asin"] == "B0PAXUXLW4"
    # over the eval split the expert's product is the first result for most goals
    first = 0
    for task in env.tasks("eval")["task"]:
        env.reset(task)
        env.step(env.expert_action())
        first += env.expert_action() == f"click[{env.store.products[env._results[0]]['asin'].lower()}]"
    assert first == 139  # of 200 (the goal's own product is the first result for 78)


def test_expert_thought_names_the_next_decision(env):
    # train-0970 (one option, "1 pound"): on the product page the thought writes out the expert's comparison (the
    # task's options the product offers, the selected ones) before the next click; train-0000 has two options.
    env.reset("train-0970")
    steps = []
    for _ in range(5):
        action = env.expert_action()
        thought = env.expert_thought(action)
        steps.append((thought, action))
        _, reward, done, _ = env.step(action)
        if done:
            break
    assert [t for t, _ in steps] == ["search the task", "open the highest-ranked result that fits the task",
                                     "task options: 1 pound. selected: none. next: 1 pound",
                                     "task options: 1 pound. selected: 1 pound. next: buy"]
    assert [a for _, a in steps[1:]] == ["click[b0cptu4k6w]", "click[1 pound]", "click[buy now]"]
    assert reward == SUCCESS_REWARD and env.expert_thought(env.expert_action()) == ""  # the episode is over
    env.reset("train-0000")  # navy blue, then 15.6 inch, in the order the task names them
    thoughts = []
    while not env._done:
        action = env.expert_action()
        thoughts.append(env.expert_thought(action))
        env.step(action)
    assert thoughts[2:] == ["task options: navy blue, 15.6 inch. selected: none. next: navy blue",
                            "task options: navy blue, 15.6 inch. selected: navy blue. next: 15.6 inch",
                            "task options: navy blue, 15.6 inch. selected: navy blue, 15.6 inch. next: buy"]


# ------------------------------------------------------------------------------------ determinism, pages
def test_same_seed_same_first_observation(env):
    a, info = env.reset("train-0042", 7)
    env.step("search[anything]")
    b, _ = env.reset("train-0042", 7)
    c, _ = WebShopEnv().reset("train-0042", 7)
    assert a == b == c
    assert a.startswith("WebShop [SEP] Instruction: [SEP] ") and a.endswith(" [SEP] Search")
    assert info["admissible_actions"] == ["search[<your query>]"]
    assert info["instruction"] in a
    assert info["task_type"] == env.store.goal_by_id["train-0042"]["product_type"]
    d, _ = env.reset(42, 0)  # int = index into train
    assert d == a
    assert WebShopEnv(split="eval").reset(3, 0)[0] == env.reset("eval-0003", 0)[0]
    with pytest.raises(ValueError, match="out of range"):
        env.reset(10**6, 0)


def test_pickle_roundtrip(env):
    import pickle

    env.reset("eval-0004", 0)
    obs, *_ = env.step("search[tea]")
    copy = pickle.loads(pickle.dumps(env))
    assert copy.store is env.store and len(pickle.dumps(env)) < 100_000
    assert copy.step("click[next >]")[0] == env.step("click[next >]")[0]


def test_invalid_actions(env):
    obs0, _ = env.reset("eval-0001", 0)
    for bad in ["click[buy now]", "buy it", "", "search[]", "search[shoes", env.invalid_action, "jump[x]"]:
        obs, reward, done, info = env.step(bad)
        assert (obs, reward, done, info["action_valid"]) == (obs0, 0.0, False, False), bad
    obs1, _, _, info = env.step("search[running shoes]")
    assert info["action_valid"] and obs1 != obs0
    for bad in ["search[tea]", "click[description]", "click[b0notthere]", "click[< prev]",
                env.invalid_action]:
        obs, reward, done, info = env.step(bad)
        assert (obs, reward, done, info["action_valid"]) == (obs1, 0.0, False, False), bad
    assert {"click[next >]", "click[back to search]"} <= set(info["admissible_actions"])


def test_case_and_whitespace_tolerance(env):
    env.reset("eval-0001", 0)
    _, _, _, info = env.step("  SEARCH[ running   shoes ] ")
    assert info["action_valid"]
    first = next(a for a in info["admissible_actions"] if a.startswith("click[b0"))
    asin = first[len("click["):-1].upper()
    assert env.step(" Click[ Next> ]")[3]["action_valid"]
    assert env.step("click[< PREV]")[3]["action_valid"]
    obs, _, _, info = env.step(f"click[{asin}]")
    assert info["action_valid"] and "Buy Now" in obs and "click[buy now]" in info["admissible_actions"]
    assert env.step("click[Description]")[3]["action_valid"]
    obs, _, _, info = env.step("click[< prev]")
    assert info["action_valid"] and "Buy Now" in obs


def test_pagination(env):
    env.reset("eval-0002", 0)
    query = "lightweight running shoes"
    results = [env.store.products[i]["asin"] for i in env.store.search(query)]
    assert len(results) == 50
    page1, _, _, info = env.step(f"search[{query}]")
    assert "Page 1 (Total results: 50)" in page1 and "< Prev" not in page1
    assert "click[< prev]" not in info["admissible_actions"]
    assert [a for a in results if a in page1] == results[:10]
    page2, _, _, info = env.step("click[next >]")
    assert "Page 2 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP] " + results[10] in page2
    assert [a for a in results if a in page2] == results[10:20]
    assert [a for a in info["admissible_actions"] if a.startswith("click[b0")] == [
        f"click[{a.lower()}]" for a in results[10:20]]
    back, _, _, _ = env.step("click[< prev]")
    assert back == page1  # no turn counter: same page, same observation (anchor state)
    assert env.anchor_state(back) == env.anchor_state(page1)
    for _ in range(4):
        obs, _, _, info = env.step("click[next >]")
    assert "Page 5 (Total results: 50)" in obs and "Next >" not in obs
    assert "click[next >]" not in info["admissible_actions"]
    assert env.step("click[next >]")[3]["action_valid"] is False


def test_item_page_options_and_subpages(env):
    env.reset("eval-0000", 0)
    goal = env.store.goal_by_id["eval-0000"]
    while env._page != "item":
        env.step(env.expert_action())
    item_obs = env._obs
    product = env.store.products[env._item]
    for group, values in product["options"].items():
        assert f" [SEP] {group} [SEP] {values[0]}" in item_obs
    assert "[SEP] Selected options: none [SEP]" in item_obs  # nothing chosen yet, said on the page
    obs, _, _, _ = env.step(f"click[{goal['options'][0]}]")
    assert "Selected options: " in obs and goal["options"][0] in obs.split("Selected options: ")[1]
    desc, _, _, info = env.step("click[description]")
    assert product["description"] in desc
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    obs2, _, _, _ = env.step("click[< prev]")
    assert obs2 == obs  # selection kept
    feats, _, _, _ = env.step("click[features]")
    assert all(f in feats for f in product["features"])
    env.step("click[< prev]")
    search, _, _, info = env.step("click[back to search]")
    assert search == env.reset("eval-0000", 0)[0]


def test_step_after_done_and_before_reset():
    fresh = WebShopEnv()
    with pytest.raises(RuntimeError):
        fresh.step("search[x]")
    reward, info = run_expert(fresh, "eval-0005")
    assert reward == SUCCESS_REWARD and info["won"] and info["admissible_actions"] == []
    obs, reward, done, info = fresh.step("click[buy now]")
    assert (reward, done, info["action_valid"]) == (0.0, True, False)


# ------------------------------------------------------------------------------------------ data, splits
def test_splits_and_catalog(env):
    train, ev = env.tasks("train"), env.tasks("eval")
    assert set(train.column_names) >= {"task", "seed", "task_type"}
    assert len(train) >= 900 and len(ev) >= 200
    assert list(env.tasks("test")["task"]) == list(ev["task"])
    train, ev = list(train["task"]), list(ev["task"])
    instr = lambda ids: {env.store.goal_by_id[t]["instruction"] for t in ids}  # noqa: E731
    assert not set(train) & set(ev)
    assert not instr(train) & instr(ev)
    assert len(instr(train)) == len(train)
    assert all(t.startswith("train-") for t in train) and isinstance(env.tasks("train")["seed"][0], int)
    products = env.store.products
    assert len(products) >= 500 and len({p["product_type"] for p in products}) >= 10
    assert len({p["asin"] for p in products}) == len(products)
    with pytest.raises(ValueError, match="validation"):
        env.tasks("validation")
    with pytest.raises(ValueError):
        env.reset("nope-0001", 0)


def test_bundled_goal_specs_are_unique_and_never_cross_splits(env):
    # train-0809 / eval-0061 used to be one goal (herbal tea, non gmo, 40 count, under $10) worded twice
    specs = {split: [goal_spec(g, price=False) for g in goals] for split, goals in env.store.splits.items()}
    assert len(specs["train"]) == 1000 and len(specs["eval"]) == 200
    assert len(set(specs["train"]) | set(specs["eval"])) == 1200  # not even a re-priced copy anywhere


def test_split_goals_groups_near_duplicates_in_one_split():
    def goal(i, ptype="tea", attrs=("non gmo",), opts=("40 count",), cap=10.0, text=None):
        text = text or f"goal {i} {ptype} {' '.join(attrs)} {' '.join(opts)}"
        return {"id": i, "product_type": ptype, "attributes": list(attrs), "options": list(opts),
                "price_upper": cap, "instruction": f"{text}, and price lower than {cap:.2f} dollars"}

    goals = [
        goal(0),                                                # eval (first group)
        goal(1, text="find me NON GMO tea"),                    # same spec, other wording: one task, dropped
        goal(2, cap=20.0),                                      # same spec, other cap: eval with 0
        goal(3, ptype="coffee"),                                # new group: train (eval is full)
        goal(4, ptype="soap", text="goal 0 tea non gmo 40 count"),  # other spec, eval's text: eval
        goal(5, attrs=("Non GMO",), opts=("40 Count",), cap=20.0),  # = goal 2 after normalisation: dropped
        goal(6, ptype="coffee", cap=30.0),                      # re-priced coffee: train with 3
    ]
    train, evals = _split_goals(goals, n_eval=1)
    assert [g["id"] for g in evals] == [0, 2, 4] and [g["id"] for g in train] == [3, 6]
    assert goal_spec(goals[5]) == goal_spec(goals[2]) != goal_spec(goals[0])


def test_every_goal_is_achievable(env):
    for goals in env.store.splits.values():
        for g in goals:
            p = env.store.products[env.store.by_asin[g["asin"].lower()]]
            assert p["price"] <= g["price_upper"]
            offered = {v for vs in p["options"].values() for v in vs}
            assert set(g["options"]) <= offered and set(g["attributes"]) <= set(p["attributes"])
            assert webshop_score(g, p, g["options"]) == 1.0
            assert normalize(g["price_upper"].__format__(".2f")) in normalize(g["instruction"])


def test_catalog_regenerates_byte_identical(tmp_path):
    script = ROOT / "scripts" / "make_webshop_catalog.py"
    spec = importlib.util.spec_from_file_location("make_webshop_catalog", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    paths = mod.write(tmp_path)
    assert {p.name for p in paths} == {"catalog.json.gz", "goals.json.gz"}
    total = 0
    for p in paths:
        committed = (BUNDLED_DIR / p.name).read_bytes()
        assert gzip.decompress(p.read_bytes()) == gzip.decompress(committed), f"{p.name}: content differs"
        assert p.read_bytes() == committed, f"{p.name}: same JSON, different gzip bytes (zlib version?)"
        total += len(committed)
    assert total <= 2 * 1024 * 1024


def test_bundled_load_is_fast_and_cached():
    t = time.perf_counter()
    store = _Store(*load_bundled(), source="timing")
    assert time.perf_counter() - t < 2.0
    assert len(store.products) >= 500
    assert WebShopEnv().store is WebShopEnv().store is get_store("bundled")


def test_check_env():
    check_env(WebShopEnv())
    check_env(WebShopEnv(), task="eval-0003", seed=1, num_steps=5)


# ------------------------------------------------------------------------------------ real-format loader
def _fake_webshop_dir(path: Path) -> Path:
    products = [
        {
            "asin": "B0FAKE0001", "name": "Sunny Moisturizing Shampoo for Dry Hair, Sulfate Free",
            "pricing": "$12.99", "product_category": "Beauty & Personal Care › Hair Care › Shampoos",
            "category": "beauty", "query": "shampoo", "average_rating": 4.5,
            "customization_options": {"Size": [{"value": "8 Fl Oz", "is_selected": True, "url": None},
                                               {"value": "16 Fl Oz", "is_selected": False, "url": None}],
                                      "Scent": [{"value": "Coconut"}, {"value": "Mint"}]},
            "small_description": ["Sulfate free formula", "Gentle on dry hair"],
            "full_description": "A shampoo for dry hair.",
        },
        {
            "asin": "B0FAKE0002", "name": "Bolt Bluetooth Headphones Noise Cancelling",
            "pricing": "$45.00 - $60.00", "product_category": "Electronics › Headphones › Over-Ear",
            "category": "electronics", "query": "headphones", "customization_options": None,
            "small_description": ["Noise cancelling", "40h battery"], "full_description": "",
        },
        {
            "asin": "B0FAKE0003", "name": "Plain Shampoo", "pricing": "",
            "product_category": "Beauty & Personal Care › Hair Care › Shampoos", "category": "beauty",
            "query": "shampoo", "customization_options": {},
        },
        {"asin": "B0FAKE0004", "name": "Crunchy Granola Bars, Gluten Free", "pricing": "$8.50",
         "product_category": "Grocery & Gourmet Food › Snacks", "category": "food",
         "query": "granola bars"},
    ]
    ins = {
        "B0FAKE0001": {"attributes": ["sulfate free", "dry hair"],
                       "instruction": "i need a sulfate free shampoo",
                       "instruction_attributes": ["sulfate free"],
                       "instruction_options": ["16 fl oz", "mint"]},
        "B0FAKE0002": {"instruction": "i want noise cancelling headphones, and price lower than 70.00 "
                                      "dollars",
                       "instruction_attributes": ["noise cancelling"], "instruction_options": []},
        "B0FAKE0003": {"instruction": "", "instruction_attributes": []},
        "B0FAKE0004": {"instruction": "gluten free granola bars please",
                       "instruction_attributes": ["gluten free"],
                       "instruction_options": {}},
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "items_shuffle_1000.json").write_text(json.dumps(products))
    (path / "items_ins_v2_1000.json").write_text(json.dumps(ins))
    return path


def test_real_format_loader(tmp_path, monkeypatch):
    data = _fake_webshop_dir(tmp_path / "ws")
    env = WebShopEnv(data_dir=data)
    store = env.store
    assert len(store.products) == 4
    p1 = store.products[store.by_asin["b0fake0001"]]
    assert p1["options"] == {"size": ["8 fl oz", "16 fl oz"], "scent": ["coconut", "mint"]}
    assert p1["price"] == 12.99 and p1["product_type"] == "shampoo"
    assert store.products[store.by_asin["b0fake0002"]]["price"] == 45.0
    assert store.products[store.by_asin["b0fake0003"]]["price"] == 100.0
    goals = {g["asin"]: g for gs in store.splits.values() for g in gs}
    assert set(goals) == {"B0FAKE0001", "B0FAKE0002", "B0FAKE0004"}  # empty instruction -> no goal
    g1 = goals["B0FAKE0001"]
    assert g1["instruction"].startswith("i need a sulfate free shampoo, and price lower than ")
    assert g1["price_upper"] in (20.0, 30.0, 40.0) and g1["options"] == ["16 fl oz", "mint"]
    assert goals["B0FAKE0002"]["instruction"].count("price lower than") == 1
    assert goals["B0FAKE0002"]["price_upper"] == 70.0
    assert goals["B0FAKE0002"]["task_type"] == "electronics"
    assert len(store.splits["eval"]) == 1 and len(store.splits["train"]) == 2
    for task in list(env.tasks("train")["task"]) + list(env.tasks("eval")["task"]):
        reward, info = run_expert(env, task)
        assert reward == SUCCESS_REWARD and info["won"], task
    obs, _ = env.reset("train-0000", 0)
    assert "Instruction:" in obs
    # the environment variable selects the same data (and the same cached store)
    monkeypatch.setenv("WEBSHOP_DATA", str(data))
    assert WebShopEnv().store is store
    check_env(env)


def test_real_format_near_duplicates_share_a_split(tmp_path):
    # B0FAKE0005 repeats B0FAKE0001's goal (same instruction, attributes and options) for another asin, so its
    # price cap (chosen by the asin) and price clause may differ: the two must never be split across train/eval
    data = _fake_webshop_dir(tmp_path / "ws")
    products = json.loads((data / "items_shuffle_1000.json").read_text())
    ins = json.loads((data / "items_ins_v2_1000.json").read_text())
    products.append({**products[0], "asin": "B0FAKE0005", "pricing": "$14.99"})
    ins["B0FAKE0005"] = dict(ins["B0FAKE0001"])
    (data / "items_shuffle_1000.json").write_text(json.dumps(products))
    (data / "items_ins_v2_1000.json").write_text(json.dumps(ins))
    store = WebShopEnv(data_dir=data).store
    where = {g["asin"]: split for split, goals in store.splits.items() for g in goals}
    assert set(where) == {"B0FAKE0001", "B0FAKE0002", "B0FAKE0004", "B0FAKE0005"}
    assert where["B0FAKE0001"] == where["B0FAKE0005"]
    caps = {g["asin"]: g["price_upper"] for goals in store.splits.values() for g in goals}
    assert caps["B0FAKE0001"] != caps["B0FAKE0005"]  # a re-priced copy: kept, in the same split


def test_real_format_missing_and_malformed(tmp_path):
    data = _fake_webshop_dir(tmp_path / "ws")
    (data / "items_ins_v2_1000.json").unlink()
    with pytest.raises(FileNotFoundError, match="items_ins_v2_1000.json"):
        WebShopEnv(data_dir=data)
    with pytest.raises(FileNotFoundError, match="items_shuffle.json"):
        WebShopEnv(data_dir=data, variant="full")
    with pytest.raises(FileNotFoundError, match="not_there"):
        WebShopEnv(data_dir=tmp_path / "not_there")
    bad = _fake_webshop_dir(tmp_path / "bad")
    (bad / "items_shuffle_1000.json").write_text(json.dumps({"asin": "B0X"}))
    with pytest.raises(ValueError, match="items_shuffle_1000.json"):
        WebShopEnv(data_dir=bad)
    (bad / "items_shuffle_1000.json").write_text("[{not json")
    with pytest.raises(ValueError, match="items_shuffle_1000.json"):
        WebShopEnv(data_dir=bad)
    bad2 = _fake_webshop_dir(tmp_path / "bad2")
    (bad2 / "items_ins_v2_1000.json").write_text(json.dumps(["B0FAKE0001"]))
    with pytest.raises(ValueError, match="items_ins_v2_1000.json"):
        WebShopEnv(data_dir=bad2)


def test_warmup_replay_counts_the_turns_where_the_policy_leaves_the_expert():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from warmup_replay import replay

    env = WebShopEnv()
    records = []
    for trajectory, wrong_turn in enumerate((None, 2)):  # the expert's episode, then one that buys instead of an option
        env.reset("train-0000")
        for turn in range(6):
            action = env.expert_action()
            if turn == wrong_turn:
                assert env._page == "item" and action != "click[buy now]"
                action = "click[buy now]"
            records.append({"task": "train-0000", "group": 0, "trajectory": trajectory, "turn": turn, "action": action})
            if env.step(action)[2]:
                break
    counts = replay(records)
    assert counts["search"] == {"= expert": 2} and counts["results"] == {"= expert": 2}
    assert counts["option"] == {"= expert": 2, "buy now": 1}  # train-0000 asks for two options
    assert counts["buy"] == {"= expert": 1}

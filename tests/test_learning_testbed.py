"""The learning benchmark's testbed (benchmarks/learning/): DoorCorridor names doors instead of directions but
must stay CorridorEnv underneath (same observations, rewards, anchors), and must not leak which door leads on."""

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from learning import runner, settings, statistics, testbeds, warmup  # noqa: E402  (benchmarks/learning/)
from learning import map as map_module  # noqa: E402

from gigpo_trl.envs.corridor import CorridorEnv  # noqa: E402


def make():
    return testbeds.DoorCorridor(length=12, max_turns=30, directions=2)


def test_door_actions_on_task_5_by_hand():
    env = make()
    obs, info = env.reset(task=5)
    assert obs == "room 1: left arch, right closet"
    assert info["admissible_actions"] == ["arch", "closet"] == env.legal_moves()
    assert env.expert_action() == "arch"
    obs, reward, done, info = env.step("closet")
    assert (obs, reward, done, info["action_valid"]) == ("closet off room 1: left way out", 0.0, False, True)
    assert env.legal_moves() == ["back"]
    obs, _, _, info = env.step(" Back ")
    assert obs == "room 1: left arch, right closet" and info["action_valid"]
    for bad in ("up", "left", "stairs", "back", ""):  # a direction, a door not in this room, no dead end here
        obs, reward, done, info = env.step(bad)
        assert (obs, reward, done, info["action_valid"]) == ("room 1: left arch, right closet", 0.0, False, False)
    assert env.turn == 7


def test_expert_doors_finish_in_12_turns_with_reward_1():
    env = make()
    env.reset(task=123)
    total, turns = 0.0, 0
    while not env.done:
        _, reward, _, _ = env.step(env.expert_action())
        total, turns = total + reward, turns + 1
    assert (total, turns, env.won) == (1.0, 12, True)


def test_same_observations_rewards_and_anchors_as_corridor_env():
    rng = random.Random(0)
    for task in range(20):
        door_env, base = make(), CorridorEnv(length=12, max_turns=30, directions=2)
        assert door_env.reset(task=task)[0] == base.reset(task=task)[0]
        while not door_env.done:
            choices = door_env.legal_moves() + ["vault"]
            door = rng.choice(choices)
            move = door_env._door_moves().get(door, "<invalid>")
            a = door_env.step(door)
            b = base.step(move)
            assert a[:3] == b[:3] and a[3]["action_valid"] == b[3]["action_valid"]
            assert door_env.anchor_state(a[0]) == base.anchor_state(b[0])
        assert base.done


def test_listed_doors_follow_the_observation_not_the_passage():
    # The passage is listed first exactly where it is the left door (the observation's order), i.e. the order
    # says nothing about which door leads on.
    env = make()
    first_is_passage = left_passages = 0
    for task in range(300):
        env.reset(task=task)
        first_is_passage += env.legal_moves()[0] == env.expert_action()
        left_passages += env.rooms[0].passage == "left"
    assert first_is_passage == left_passages
    assert 100 < left_passages < 200


# ------------------------------------------------------------------ the benchmark's protocol (issue 21)
import json  # noqa: E402

import pytest  # noqa: E402


def test_eval_schedule_by_hand():
    assert statistics.eval_schedule(60, 5, 10) == [10, 20, 30, 40, 50, 55, 60]
    assert statistics.eval_schedule(30, 5, 5) == [5, 10, 15, 20, 25, 30]
    assert statistics.eval_schedule(45, 5, 10) == [10, 20, 30, 35, 40, 45]
    assert statistics.eval_schedule(3, 1, 1) == [1, 2, 3]
    with pytest.raises(ValueError, match="iterations=14"):
        statistics.eval_schedule(14, 5, 10)


def test_auc_is_the_trapezoid_over_uneven_points_divided_by_the_span():
    pts = [{"iteration": 0, "sampled": 0.0}, {"iteration": 10, "sampled": 0.2}, {"iteration": 20, "sampled": 0.6},
           {"iteration": 25, "sampled": 0.6}, {"iteration": 30, "sampled": 1.0}]
    # 10 * 0.1 + 10 * 0.4 + 5 * 0.6 + 5 * 0.8 = 1 + 4 + 3 + 4 = 12, over 30 iterations
    assert statistics.auc(pts) == pytest.approx(12 / 30)
    assert statistics.auc(list(reversed(pts))) == pytest.approx(0.4)
    assert statistics.auc([{"iteration": 0, "sampled": 0.3}, {"iteration": 7, "sampled": 0.3}]) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="2 distinct iterations"):
        statistics.auc([{"iteration": 5, "sampled": 0.3}])


_TOK = {}


def _setup(argv=()):
    a = settings.parse_args(list(argv))
    factory = testbeds.env_factory_for(a)
    if "tok" not in _TOK:
        _TOK["tok"] = testbeds.make_tokenizer(a, factory, a.vocab)
    return a, factory, _TOK["tok"]


def test_warmup_batch_targets_every_legal_door_once_so_passages_and_dead_ends_balance():
    a, factory, tok = _setup(["--warmup_batch", "32"])
    ids, att, lab = warmup.warmup_batch(tok, a, factory(), random.Random(3), list(range(256)))
    targets = [tok.decode([t for t in row.tolist() if t != -100], skip_special_tokens=True) for row in lab]
    doors = [t.split("<action>")[1].split("</action>")[0] for t in targets]
    passages = sum(d in ("arch", "stairs") for d in doors)
    dead_ends = sum(d in ("closet", "niche") for d in doors)
    backs = doors.count("back")
    assert passages == dead_ends > 0 and backs > 0
    assert passages + backs == 32  # one state per room state (two doors) or dead end (back)
    assert passages + dead_ends + backs == len(doors) == ids.shape[0] == att.shape[0]


def _run(seed, arm, last3, greedy, auc_value, steps=900):
    pts = [{"iteration": 0, "sampled": 0.1, "greedy": 0.0}, {"iteration": 10, "sampled": 0.2}] + [
        {"iteration": it, "sampled": last3, "greedy": greedy} for it in (20, 25, 30)]
    return {"arm": arm, "seed": seed, "points": pts, "headline_sampled": last3, "headline_greedy": greedy,
            "auc_sampled": auc_value, "iters_to_50pct_train": None, "env_steps": steps, "generated_tokens": 7 * steps,
            "wall_seconds": 100.0, "eval_seconds": 10.0, "anchor_phases": {},
            "series": {"episode/success_rate": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]}, "run_settings": {"iterations": 30}}


def _write(folder, runs, warmups=None, wall=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    if warmups:
        (folder / "warmups.json").write_text(json.dumps(warmups))
    if wall is not None:
        (folder / "invocation.json").write_text(json.dumps({"wall_seconds": wall}))
    return str(folder / "runs.jsonl")


def test_report_only_merges_split_runs_into_the_hand_computed_gaps(tmp_path):
    warm = {"legal": 0.97, "leads_on_among_two_legal": 0.51, "n_two_door": 800, "steps": 700, "rules_steps": 500,
            "balance_rounds": 1, "seconds": 80.0, "valid_format": 1.0, "loss": 0.1}
    first = _write(tmp_path / "a", [_run(200, "GiGPO", 0.5, 0.25, 0.30), _run(200, "GRPO", 0.4, 0.25, 0.20),
                                    _run(201, "GiGPO", 0.4, 0.0, 0.25), _run(201, "GRPO", 0.4, 0.5, 0.25)],
                   {"200": warm, "201": warm | {"legal": 0.99}}, wall=1000.0)
    second = _write(tmp_path / "b", [_run(202, "GRPO", 0.5, 0.5, 0.30), _run(202, "GiGPO", 0.7, 0.5, 0.40),
                                     _run(203, "GiGPO", 0.9, 0.9, 0.9)],  # 203 lacks GRPO: not reported
                    {"202": warm | {"steps": 900}}, wall=500.0)
    out = tmp_path / "merged"
    assert runner.main(["--report_only", "--runs", first, second, "--output_dir", str(out)]) == 0
    d = json.loads((out / "learning.json").read_text())
    assert d["seeds"] == [200, 201, 202] and d["is_headline"] is False
    assert d["primary_metric"]["key"] == "headline_sampled" and d["primary_metric"]["gap"] == "GiGPO-GRPO/T=1"
    # primary: gaps 10, 0, 20 pp; mean 10, sd 10, half width t(0.975, 2) * 10 / sqrt(3) = 4.303 * 5.7735 = 24.843
    assert d["gap_pp"] == pytest.approx(10.0)
    assert d["ci95_pp"] == pytest.approx([10 - 24.8434, 10 + 24.8434], abs=1e-3)
    assert d["gaps"]["GiGPO-GRPO/T=1"]["per_seed_pp"] == pytest.approx({"200": 10.0, "201": 0.0, "202": 20.0})
    # AUC: gaps 10, 0, 10 pp; mean 6.667, sd 5.7735, half width 4.303 * 5.7735 / sqrt(3) = 14.343
    assert d["auc_gap_pp"] == pytest.approx(20 / 3)
    assert d["auc_ci95_pp"] == pytest.approx([20 / 3 - 14.3433, 20 / 3 + 14.3433], abs=1e-3)
    # greedy: 0, -50, 0 pp
    assert d["gaps"]["GiGPO-GRPO/greedy"]["gap_pp"] == pytest.approx(-50 / 3)
    assert d["per_seed"]["202"]["GiGPO"]["auc_sampled"] == 0.4
    assert d["per_seed"]["202"]["warmup"]["steps"] == 900 and d["per_seed"]["201"]["warmup"]["legal"] == 0.99
    assert d["total_seconds"] == pytest.approx(1500.0)
    assert {"gap_pp", "ci95_pp", "seeds", "headline", "per_seed"} <= set(d)


def test_report_only_refuses_duplicate_runs_and_mixed_settings(tmp_path):
    first = _write(tmp_path / "a", [_run(200, "GiGPO", 0.5, 0.0, 0.3), _run(200, "GRPO", 0.4, 0.0, 0.2)])
    dup = _write(tmp_path / "b", [_run(200, "GRPO", 0.1, 0.0, 0.1)])
    with pytest.raises(ValueError, match="seed 200 arm GRPO appears twice"):
        runner.load_runs([first, dup])
    other = _run(201, "GRPO", 0.1, 0.0, 0.1) | {"run_settings": {"iterations": 60}}
    mixed = _write(tmp_path / "c", [other])
    with pytest.raises(ValueError, match="different settings"):
        runner.load_runs([first, mixed])


def test_report_only_pairs_new_runs_with_a_recorded_report_and_names_seeds_that_started_elsewhere(tmp_path, capsys):
    warm = {"legal": 0.97, "leads_on_among_two_legal": 0.51, "n_two_door": 800, "steps": 700, "rules_steps": 500,
            "balance_rounds": 1, "seconds": 80.0, "valid_format": 1.0, "loss": 0.1}
    recorded = tmp_path / "cell" / "learning.json"
    recorded.parent.mkdir()
    recorded.write_text(json.dumps({
        "command": "python benchmarks/learning.py --condition h12", "commit": "abc1234", "total_seconds": 900.0,
        "arms": {"GiGPO": {}, "GRPO": {}}, "warmup": {"200": warm, "201": warm, "202": warm},
        "runs": [_run(200, "GiGPO", 0.5, 0.0, 0.3), _run(200, "GRPO", 0.4, 0.0, 0.2),
                 _run(201, "GiGPO", 0.6, 0.0, 0.3), _run(201, "GRPO", 0.3, 0.0, 0.2),
                 _run(202, "GiGPO", 0.6, 0.0, 0.3), _run(202, "GRPO", 0.5, 0.0, 0.2)]}))
    late = _run(201, "G2PO", 0.45, 0.0, 0.25)
    late["points"][0] = {"iteration": 0, "sampled": 0.15, "greedy": 0.0}  # seed 201 started elsewhere
    new = _write(tmp_path / "g2po", [_run(200, "G2PO", 0.7, 0.0, 0.4), late, _run(202, "G2PO", 0.5, 0.0, 0.2)],
                 {"200": warm, "201": warm, "202": warm | {"steps": 750}}, wall=100.0)
    out = tmp_path / "merged"
    assert runner.main(["--report_only", "--runs", new, "--recorded", str(recorded), "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "seed 201 G2PO differs: iteration 0 sampled 0.15 vs 0.1" in printed
    assert "seed 202 G2PO differs: warm-up steps 750 vs 700" in printed
    d = json.loads((out / "learning.json").read_text())
    assert d["arms"] == {"GiGPO": {"step_advantage_weight": 1.0}, "GRPO": {"step_advantage_weight": 0.0},
                         "G2PO": settings.ARMS["G2PO"]}
    assert d["same_start"]["differing_seeds"] == [201, 202] and d["same_start"]["reference"] == "GRPO"
    assert d["recorded"][str(recorded)] == {"command": "python benchmarks/learning.py --condition h12",
                                            "commit": "abc1234", "total_seconds": 900.0, "arms": ["GiGPO", "GRPO"]}
    # paired by seed with the recorded arms: G2PO - GRPO 30, 15, 0 pp; G2PO - GiGPO 20, -15, -10 pp
    assert d["gaps"]["G2PO-GRPO/T=1"]["per_seed_pp"] == pytest.approx({"200": 30.0, "201": 15.0, "202": 0.0})
    # mean 15, sd 15, half width t(0.975, 2) * 15 / sqrt(3) = 4.303 * 8.660 = 37.265
    assert d["gaps"]["G2PO-GRPO/T=1"]["ci95_pp"] == pytest.approx([15 - 37.265, 15 + 37.265], abs=1e-2)
    assert d["gaps"]["G2PO-GiGPO/T=1"]["gap_pp"] == pytest.approx(-5 / 3)
    assert d["per_seed"]["202"]["warmup"]["steps"] == 700  # the recorded arms' warm-up figures
    assert d["total_seconds"] == pytest.approx(1000.0)
    # the merged report already holds G2PO: merging the new runs into it again is refused
    with pytest.raises(ValueError, match="seed 200 arm G2PO appears twice"):
        runner.load_runs([new], [out / "learning.json"])


def test_runs_made_before_the_map_keys_merge_with_runs_at_their_defaults(tmp_path):
    # a headline run stored before issue 35 lacks the map's keys; a new run of the same protocol has them at defaults
    old = _write(tmp_path / "old", [_run(200, "GiGPO", 0.5, 0.0, 0.3), _run(200, "GRPO", 0.4, 0.0, 0.2)])
    new_settings = {"iterations": 30, "nuisance": None, "trap_door": False, "condition": None,
                    "anchor_drops_nuisance": False, "anchor_similarity_threshold": None}
    new = _write(tmp_path / "new", [_run(200, "GraphGPO", 0.6, 0.0, 0.4) | {"run_settings": new_settings}])
    assert sorted(runner.load_runs([old, new])) == [(200, "GRPO"), (200, "GiGPO"), (200, "GraphGPO")]
    trap = _write(tmp_path / "trap", [_run(201, "GraphGPO", 0.6, 0.0, 0.4)
                                      | {"run_settings": new_settings | {"trap_door": True}}])
    with pytest.raises(ValueError, match="different settings"):
        runner.load_runs([old, trap])


def test_warmup_that_misses_its_cap_fails_naming_the_seed():
    from tiny_models import build_tiny_model

    a, factory, tok = _setup(["--warmup_steps", "1", "--warmup_max_steps", "2", "--warmup_batch", "2"])
    model = build_tiny_model(tok, hidden_size=a.hidden, num_layers=a.layers, seed=7)
    with pytest.raises(warmup.WarmupFailed, match=r"seed 7: warm-up failed at the 2-step cap .*legal moves nan"):
        warmup.legal_move_warmup(model, tok, a, factory, list(range(16)), seed=7)
    a.warmup_fail_soft = True  # --quick: reported, not raised
    stats = warmup.legal_move_warmup(model, tok, a, factory, list(range(16)), seed=7)
    assert stats["steps"] == 2 and stats["rules_steps"] is None and stats["failed"].startswith("seed 7: ")


def test_door_balance_tolerance():
    a = settings.parse_args([])
    assert a.warmup_balance_tol == 0.05
    assert warmup.door_balanced({"leads_on_among_two_legal": 0.55}, a)
    assert warmup.door_balanced({"leads_on_among_two_legal": 0.45}, a)
    assert not warmup.door_balanced({"leads_on_among_two_legal": 0.56}, a)
    assert not warmup.door_balanced({"leads_on_among_two_legal": 0.44}, a)
    assert not warmup.door_balanced({"leads_on_among_two_legal": None}, a)


def test_headline_seeds_are_ten_fixed_seeds_disjoint_from_design_and_quick_seeds():
    assert settings.HEADLINE_SEEDS == list(range(200, 210))
    assert not set(settings.HEADLINE_SEEDS) & set(settings.DESIGN_SEEDS + [0, 1, 2, 103])
    assert settings.parse_args([]).seeds == settings.HEADLINE_SEEDS
    assert settings.parse_args(["--quick"]).seeds == [0]


def test_warmup_restarts_from_a_fresh_init_derived_from_the_seed():
    from tiny_models import build_tiny_model

    a, factory, tok = _setup(["--warmup_steps", "1", "--warmup_max_steps", "5", "--warmup_batch", "2",
                              "--warmup_restart_steps", "2"])
    a.warmup_fail_soft = True
    model = build_tiny_model(tok, hidden_size=a.hidden, num_layers=a.layers, seed=7)
    stats = warmup.legal_move_warmup(model, tok, a, factory, list(range(16)), seed=7)
    # steps 1-2 on init 7, restart at step 2 (init 10007), steps 3-4, restart at 4 (init 20007), step 5, cap
    assert (stats["steps"], stats["restarts"], stats["init_seed"]) == (5, 2, 20007)
    assert "after 2 restart(s)" in stats["failed"]
    assert "restart" in settings.WARMUP_KEYS[-1]


def test_iters_to_counts_only_full_windows():
    # a first rollout at 0.5 is a 1-iteration "running mean" of 0.5; the first full 5-window mean >= 0.5 is at 8:
    # (0.31+0.47+0.62+0.47+0.41)/5 = 0.456 at 7, (0.47+0.62+0.47+0.41+0.62)/5 = 0.518 at 8
    series = [0.5, 0.28, 0.31, 0.47, 0.62, 0.47, 0.41, 0.62, 0.69, 0.78]
    assert statistics.iters_to(series) == 8
    assert statistics.iters_to([0.5] * 5) == 5
    assert statistics.iters_to([0.9] * 4) is None  # never a full window
    assert statistics.iters_to([0.1] * 10) is None


# ------------------------------------------------------------------ the map (issue 35)
def test_map_seeds_are_fresh_and_apart_from_the_design_seeds():
    used = set(range(0, 12)) | set(range(100, 105)) | set(range(200, 210)) | set(range(300, 305)) | set(range(500, 510))
    assert len(settings.MAP_SEEDS) >= 8 and settings.MAP_EVAL_TASKS >= 128
    assert not (set(settings.MAP_SEEDS) | set(settings.MAP_DESIGN_SEEDS)) & used
    assert not set(settings.MAP_SEEDS) & set(settings.MAP_DESIGN_SEEDS)
    assert {c for cs in settings.MAP_AXES.values() for c in cs} == set(settings.CONDITIONS)


def test_condition_settings_reach_the_env_and_the_config():
    a = settings.parse_args(["--condition", "clock_sim", "--iterations", "20"])
    assert (a.length, a.max_turns, a.nuisance, a.anchor_similarity_threshold, a.eval_tasks, a.seeds) == (
        12, 30, "clock", 0.9, 128, settings.MAP_SEEDS)
    # GraphGPO matches states exactly: no similarity cell
    assert a.arms == ["GiGPO", "GRPO", "HGPO", "G2PO", "RLOO", "PPO"]
    env = testbeds.env_factory_for(a)()
    obs, _ = env.reset(task=5)
    assert obs.startswith("room 1: left arch, right closet\nclock ")
    assert env.anchor_state(obs) == obs  # exact anchors see the nuisance
    cfg = runner.make_config(a, "/tmp/x", settings.ARMS["GiGPO"], 600)
    assert cfg.anchor_similarity_threshold == 0.9 and cfg.max_turns == 30
    # G2PO's values over the merged step groups, with the corridor's success reward
    g2po = runner.make_config(a, "/tmp/x", settings.ARMS["G2PO"], 600)
    assert (g2po.step_return, g2po.g2po_success_reward, g2po.anchor_similarity_threshold, g2po.gamma) == (
        "g2po", 1.0, 0.9, 0.95)
    # the baselines group no states: no threshold; their recipes' fields over the shared ones
    # (benchmarks/experiments/baselines_arm.md)
    rloo = runner.make_config(a, "/tmp/x", settings.ARMS["RLOO"], 600)
    assert (rloo.estimator, rloo.advantage_mode, rloo.step_advantage_weight, rloo.episode_stats,
            rloo.anchor_similarity_threshold) == ("rloo", "leave_one_out", 0.0, "trajectories", None)
    ppo = runner.make_config(a, "/tmp/x", settings.ARMS["PPO"], 600)
    assert (ppo.estimator, ppo.gamma, ppo.lam, ppo.gae_level, ppo.critic_learning_rate, ppo.learning_rate,
            ppo.anchor_similarity_threshold) == ("ppo", 1.0, 1.0, "token", 2.5e-4, 2.5e-5, None)
    hook = settings.parse_args(["--condition", "clock_hook", "--iterations", "20"])
    env = testbeds.env_factory_for(hook)()
    obs, _ = env.reset(task=5)
    assert env.anchor_state(obs) == "room 1: left arch, right closet"
    assert runner.make_config(hook, "/tmp/x", settings.ARMS["GraphGPO"], 600).anchor_similarity_threshold is None
    h24 = settings.parse_args(["--condition", "h24", "--iterations", "20"])
    assert (h24.length, h24.max_turns, h24.walk_turns) == (24, 60, 72)
    trap = testbeds.env_factory_for(settings.parse_args(["--condition", "trap", "--iterations", "20"]))()
    trap.reset(task=3)  # task 3: the trap is room 4's left closet (tests/test_corridor.py)
    for door in ("arch", "stairs", "arch"):
        trap.step(door)
    _, reward, done, info = trap.step("closet")
    assert (reward, done, info["trapped"]) == (0.0, True, True)
    # the default run is untouched
    plain = settings.parse_args([])
    assert (plain.condition, plain.nuisance, plain.trap_door, plain.eval_tasks) == (None, None, False, 64)
    assert testbeds.env_factory_for(plain)().reset(task=5)[0] == "room 1: left arch, right closet"


def test_condition_without_iterations_or_with_a_foreign_arm_is_refused(monkeypatch):
    # a cell whose design run has not set I yet (every cell of the map has one now)
    monkeypatch.setitem(settings.CONDITIONS, "h24", settings.CONDITIONS["h24"] | {"iterations": None})
    with pytest.raises(SystemExit):
        settings.parse_args(["--condition", "h24"])
    monkeypatch.undo()
    assert settings.parse_args(["--condition", "h24"]).iterations == 10  # the design run's budget rule
    with pytest.raises(SystemExit):
        settings.parse_args(["--condition", "clock_sim", "--iterations", "10", "--arms", "GraphGPO"])
    assert settings.parse_args(["--condition", "h6", "--quick"]).iterations == 3
    # evaluations every I // 5 (at least 2) iterations: the headline's schedule at I = 10
    for iters, every in ((10, 2), (30, 6), (40, 8)):
        a = settings.parse_args(["--condition", "h6", "--iterations", str(iters)])
        assert (a.eval_every, a.eval_every_early) == (every, every)
    assert statistics.eval_schedule(30, 6, 6) == [6, 12, 18, 24, 30]


def test_map_report_table_and_figure_from_cells(tmp_path):
    def cell(name, gaps, seeds=settings.MAP_SEEDS, between=None):
        folder = tmp_path / name
        folder.mkdir()
        d = {"seeds": seeds, "is_map_cell": seeds == settings.MAP_SEEDS, "gaps": {
            f"{arm}-GRPO/T=1": {"gap_pp": m, "ci95_pp": [m - 2.0, m + 3.0]} for arm, m in gaps.items()}}
        d["gaps"] |= {f"{pair}/T=1": {"gap_pp": m, "ci95_pp": [m - 1.0, m + 1.0]} for pair, m in (between or {}).items()}
        (folder / "learning.json").write_text(json.dumps(d))

    cell("h6", {"GiGPO": 3.0, "HGPO": 5.5, "GraphGPO": 1.0, "G2PO": 4.0, "RLOO": 0.5, "PPO": -2.0},
         between={"G2PO-GraphGPO": 3.0, "PPO-GiGPO": -5.0})
    cell("clock", {"GiGPO": -0.5, "HGPO": 0.2, "GraphGPO": 0.0, "RLOO": 0.0, "PPO": 1.0}, seeds=[600, 601])
    cell("clock_sim", {"GiGPO": 1.5, "HGPO": 2.0, "PPO": 0.0})
    assert runner.main(["--map_report", "--map_dir", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "map.json").read_text())
    assert d["gaps_to_grpo"]["h6"]["HGPO"] == {"gap_pp": 5.5, "ci95_pp": [3.5, 8.5]}
    assert "GraphGPO" not in d["gaps_to_grpo"]["clock_sim"]
    assert d["missing"] == ["h12", "h24", "clock_hook", "trap"] and d["partial"] == ["clock"]
    # G2PO has run only in h6; clock_sim has no GraphGPO arm, so GraphGPO is not pending there
    assert d["pending"] == {"clock": ["G2PO"], "clock_sim": ["G2PO", "RLOO"]}
    assert d["gaps_to_grpo"]["h6"]["G2PO"] == {"gap_pp": 4.0, "ci95_pp": [2.0, 7.0]}
    assert d["gaps_to_grpo"]["h6"]["PPO"] == {"gap_pp": -2.0, "ci95_pp": [-4.0, 1.0]}
    assert d["gaps_between"] == {"h6": {"G2PO-GraphGPO": {"gap_pp": 3.0, "ci95_pp": [2.0, 4.0]},
                                        "PPO-GiGPO": {"gap_pp": -5.0, "ci95_pp": [-6.0, -4.0]}}}
    assert "+5.5 [  +3.5,   +8.5]" in d["table"]
    assert (tmp_path / "map.png").stat().st_size > 10_000
    assert runner.main(["--map_report", "--map_dir", str(tmp_path / "empty")]) == 1


def test_map_report_folds_the_baselines_paired_with_their_own_grpo(tmp_path):
    """RLOO and PPO come from map_baselines/CELL (paired with a GRPO re-run beside them, and with GiGPO / G2PO
    re-runs for the secondary comparisons); nothing else of that report replaces a recorded gap, and the re-run GRPO is compared with the recorded one seed by seed."""
    def write(folder, d):
        folder.mkdir(parents=True)
        (folder / "learning.json").write_text(json.dumps(d))

    gap = lambda m: {"gap_pp": m, "ci95_pp": [m - 1.0, m + 1.0]}  # noqa: E731
    runs = lambda values, cpu=None: [{"arm": "GRPO", "seed": s, "headline_sampled": v, "cpu_model": cpu}  # noqa: E731
                                     for s, v in values.items()]
    write(tmp_path / "map" / "h6", {"seeds": settings.MAP_SEEDS, "is_map_cell": True,
                                    "gaps": {"GiGPO-GRPO/T=1": gap(3.0)}, "runs": runs({600: 0.50, 601: 0.70})})
    nan = float("nan")  # the critic's explained variance is logged nan where the returns did not vary
    ppo = [{"arm": "PPO", "seed": 600, "cpu_model": "Xeon", "series": {"critic/explained_variance": [-2.0, nan, -0.5, 0.1, 0.3],
                                                  "critic/value_error": [0.9, 0.8, 0.5, 0.4, 0.3]}},
           {"arm": "PPO", "seed": 601, "cpu_model": "Xeon", "series": {"critic/explained_variance": [-1.0, 0.0, 0.0, 0.2, nan],
                                                  "critic/value_error": [0.7, 0.6, 0.5, 0.5, 0.5]}}]
    write(tmp_path / "map_baselines" / "h6", {
        "seeds": [600, 601], "gaps": {"RLOO-GRPO/T=1": gap(0.5), "PPO-GRPO/T=1": gap(-2.0), "GiGPO-GRPO/T=1": gap(9.0),
                                      "PPO-GiGPO/T=1": gap(-4.0), "RLOO-GiGPO/T=1": gap(1.0),
                                      "G2PO-GiGPO/T=1": gap(7.0)},
        "runs": runs({600: 0.55, 601: 0.60}, cpu="Xeon") + ppo})
    assert runner.main(["--map_report", "--map_dir", str(tmp_path / "map")]) == 0
    d = json.loads((tmp_path / "map" / "map.json").read_text())
    assert d["gaps_to_grpo"]["h6"] == {"GiGPO": gap(3.0), "RLOO": gap(0.5), "PPO": gap(-2.0)}
    # the secondary comparisons of the new arms with the re-run GiGPO; not a gap between two re-run step arms
    assert d["gaps_between"] == {"h6": {"PPO-GiGPO": gap(-4.0), "RLOO-GiGPO": gap(1.0)}}
    rerun = d["baselines"]["h6"]
    assert rerun["cpu_models"] == ["Xeon"] and rerun["seeds"] == [600, 601]
    # per seed (0.55 - 0.50, 0.60 - 0.70) in pp: +5, -10; mean -2.5; t(1) = 12.706, sd = 10.607, n = 2
    assert rerun["grpo_rerun_minus_recorded"]["per_seed_pp"] == pytest.approx({"600": 5.0, "601": -10.0})
    assert rerun["grpo_rerun_minus_recorded"]["gap_pp"] == pytest.approx(-2.5)
    assert rerun["grpo_rerun_minus_recorded"]["ci95_pp"] == pytest.approx([-2.5 - 95.3, -2.5 + 95.3], abs=0.01)
    # the critic: first iteration (-2.0 + -1.0) / 2; last 3 per seed, nan left out: mean(-0.5, 0.1, 0.3) = -1/30 and
    # mean(0.0, 0.2) = 0.1, then over the seeds 1/30; value error (0.9 + 0.7) / 2 and (0.4 + 0.5) / 2
    assert rerun["ppo_critic"] == pytest.approx({"seeds": 2, "explained_variance_first": -1.5,
                                                 "explained_variance_last3": 0.0333, "value_error_first": 0.8,
                                                 "value_error_last3": 0.45}, abs=1e-4)
    assert map_module.critic_quality({"runs": runs({600: 0.5})}) is None  # no PPO run


def test_a_complete_cell_reports_to_its_results_folder_and_a_partial_one_does_not():
    a = settings.parse_args(["--condition", "h12"])
    assert settings.default_results_dir(a, settings.MAP_SEEDS).endswith(os.path.join("results", "map", "h12"))
    assert settings.default_results_dir(a, settings.MAP_SEEDS[:4]) == a.output_dir
    q = settings.parse_args(["--condition", "h12", "--quick"])
    assert settings.default_results_dir(q, settings.MAP_SEEDS) == q.output_dir


def test_step_group_sizes_observer_keeps_training_rollouts_and_the_deepest_hgpo_level():
    from types import SimpleNamespace

    import numpy as np

    from gigpo_trl.observers import RolloutContext

    groups = runner.StepGroupSizes()
    gigpo = SimpleNamespace(anchor_group_sizes=np.array([2, 2, 1]), level_group_sizes=None)
    hgpo = SimpleNamespace(anchor_group_sizes=np.array([3, 3, 3]), level_group_sizes=np.array([[3, 2], [3, 2], [3, 1]]))
    groups.on_advantages(None, gigpo, RolloutContext(mode="train", iteration=1))
    groups.on_advantages(None, hgpo, RolloutContext(mode="eval", name="eval"))  # an evaluation: not counted
    groups.on_advantages(None, None, RolloutContext(mode="train", iteration=2))  # no row on any process
    groups.on_advantages(None, hgpo, RolloutContext(mode="train", iteration=3))
    assert [list(s) for s in groups.iterations] == [[2, 2, 1], [3, 3, 3]]
    assert [list(s) for s in groups.deepest] == [[2, 2, 1]]


def test_a_max_staleness_run_never_reports_to_the_map_cell():
    a = settings.parse_args(["--condition", "h12", "--max_staleness", "4"])
    assert a.max_staleness == 4 and "max_staleness" in settings.RUN_KEYS
    assert settings.default_results_dir(a, settings.MAP_SEEDS) == a.output_dir
    assert settings.run_settings_filled({})["max_staleness"] is None  # the map's runs: the trainer generated itself


def _standin(tiny_tokenizer, seed=0):
    from tiny_models import build_tiny_model

    from learning import server_standin

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, seed=seed)
    with server_standin.serving(model) as server:
        client = server(base_url="http://in-process")
    return model, server, client


def test_standin_log_probs_are_the_policy_forwards_at_the_request_temperature(tiny_tokenizer):
    import torch

    model, server, client = _standin(tiny_tokenizer)
    prompts = [tiny_tokenizer.encode("go left then right"), tiny_tokenizer.encode("right")]  # unequal: left padding
    torch.manual_seed(0)
    out = client.generate(prompts, n=2, temperature=0.7, max_tokens=6)
    assert out["prompt_ids"] == prompts and len(out["completion_ids"]) == 4
    for i, (ids, logps) in enumerate(zip(out["completion_ids"], out["logprobs"])):
        prompt = prompts[i // 2]  # prompt-major, n completions each
        assert 1 <= len(ids) <= 6 and tiny_tokenizer.eos_token_id not in ids[:-1]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor([lp[0] for lp in logps]), expected, atol=1e-4)


def test_standin_samples_the_whole_distribution_and_refuses_truncation(tiny_tokenizer):
    import pytest
    import torch

    _, _, client = _standin(tiny_tokenizer)
    torch.manual_seed(0)
    first = client.generate([[5, 6, 7]], n=400, temperature=50.0, max_tokens=1)["completion_ids"]
    # ~uniform over ~300 tokens: 400 draws hit far more than transformers' default top_k of 50 distinct tokens
    assert len({ids[0] for ids in first}) > 120
    with pytest.raises(ValueError, match="top_p=0.9"):
        client.generate([[5, 6, 7]], temperature=1.0, top_p=0.9, max_tokens=1)
    with pytest.raises(ValueError, match="seed=3"):
        client.generate([[5, 6, 7]], max_tokens=1, generation_kwargs={"seed": 3})


def _served_by(client, model, prompt) -> bool:
    """Whether ``client``'s log-probs of a completion it samples are ``model``'s (at temperature 1)."""
    import torch

    out = client.generate([prompt], temperature=1.0, max_tokens=4)
    ids, logps = out["completion_ids"][0], [lp[0] for lp in out["logprobs"][0]]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    return torch.allclose(torch.tensor(logps), expected, atol=1e-4)


def test_standin_serves_the_pushed_weights_only(tiny_tokenizer):
    import copy

    import torch

    from tiny_models import build_tiny_model

    model, server, client = _standin(tiny_tokenizer, seed=0)
    original = copy.deepcopy(model)
    other = build_tiny_model(tiny_tokenizer, hidden_size=32, seed=1)
    prompt = tiny_tokenizer.encode("go left then right")
    assert _served_by(client, original, prompt) and not _served_by(client, other, prompt)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # the trainer's weights move; the server's do not until a push
    assert _served_by(client, original, prompt)
    named = list(other.named_parameters())
    client.update_named_params([(n, p.dtype, p.shape) for n, p in named], iter(named))
    assert _served_by(client, other, prompt) and not _served_by(client, original, prompt) and server.pushes == 1


def _staleness_runs(tmp_path, k, values, series=None):
    """A runs.jsonl of max_staleness ``k``: ``values`` {(seed, arm): headline_sampled}."""
    import json

    path = tmp_path / f"runs{k}.jsonl"
    settings_ = {key: None for key in settings.RUN_KEYS} | {"max_staleness": k}
    lines = [json.dumps({"seed": s, "arm": arm, "run_settings": settings_, "headline_sampled": v,
                         "headline_greedy": v / 2, "auc_sampled": v, "cpu_seconds": 10.0,
                         "series": {"episode/success_rate": [0.1], **(series or {})}})
             for (s, arm), v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_staleness_report_pairs_each_seed_and_arm_with_the_synchronous_run(tmp_path):
    import json

    import pytest

    from learning import staleness

    sync = _staleness_runs(tmp_path, 0, {(1, "GiGPO"): 0.50, (1, "GRPO"): 0.40, (2, "GiGPO"): 0.60, (2, "GRPO"): 0.55})
    stale = _staleness_runs(tmp_path, 4, {(1, "GiGPO"): 0.45, (1, "GRPO"): 0.40, (2, "GiGPO"): 0.62, (2, "GRPO"): 0.50},
                            {"async/staleness_mean": [0.0, 4.0], "async/staleness_max": [0.0, 4.0],
                             "sampling/importance_sampling_ratio/mean": [1.0, 0.98],
                             "sampling/importance_sampling_ratio/max": [1.0, 1.3],
                             "sampling/importance_sampling_ratio/truncated_fraction": [0.0, 0.1]})
    out = tmp_path / "async_learning.json"
    assert staleness.staleness_report([sync, stale], out) == 0
    f = json.loads(out.read_text())["figures"]
    moved = f["staleness_vs_sync"]["GiGPO/4-0/T=1"]
    assert moved["per_seed_pp"] == pytest.approx({"1": -5.0, "2": 2.0}) and moved["gap_pp"] == pytest.approx(-1.5)
    assert f["staleness_vs_sync"]["GRPO/4-0/T=1"]["gap_pp"] == pytest.approx(-2.5)
    # GiGPO - GRPO: +10, +5 synchronous; +5, +12 at staleness 4 -> moved -5, +7
    assert f["gap_to_grpo_moved"]["GiGPO-GRPO/4-0/T=1"]["per_seed_pp"] == pytest.approx({"1": -5.0, "2": 7.0})
    assert f["per_staleness"]["4"]["gap_to_grpo"]["GiGPO-GRPO/T=1"]["gap_pp"] == pytest.approx(8.5)
    four = f["per_staleness"]["4"]
    assert (four["staleness_mean"], four["staleness_max"], four["is_ratio_max"]) == pytest.approx((2.0, 4.0, 1.3))
    assert four["is_truncated_fraction"] == pytest.approx(0.05) and f["per_staleness"]["0"]["staleness_mean"] is None
    with pytest.raises(ValueError, match="need the runs of max_staleness 0"):
        staleness.staleness_report([stale], out)
    with pytest.raises(ValueError, match="a second file of max_staleness 0"):
        staleness.staleness_report([sync, sync], out)


# ------------------------------------------------------------------ a pretrained model (--model, issue 63)
def test_model_refuses_the_tiny_policys_flags_naming_them():
    with pytest.raises(ValueError, match="--vocab 300 is a flag of the tiny policy"):
        settings.parse_args(["--model", "default", "--seeds", "700", "--vocab", "300"])
    with pytest.raises(ValueError, match="--hidden 32 is a flag of the tiny policy"):
        settings.parse_args(["--model", "default", "--seeds", "700", "--hidden", "32"])
    with pytest.raises(ValueError, match="--warmup_legal 0.9 is a flag of the tiny policy"):
        settings.parse_args(["--model", "default", "--seeds", "700", "--warmup_legal", "0.9"])
    with pytest.raises(ValueError, match="--model default needs --seeds"):
        settings.parse_args(["--model", "default"])
    with pytest.raises(ValueError, match="--warmup_episodes 4 sets the expert warm-up of --model"):
        settings.parse_args(["--warmup_episodes", "4"])
    tiny = settings.parse_args([])  # the tiny policy's defaults are unchanged
    assert (tiny.hidden, tiny.layers, tiny.vocab, tiny.warmup_lr, tiny.lr, tiny.max_completion_length) == (
        64, 2, 600, 3e-3, 2.5e-5, 10)
    llm = settings.parse_args(["--model", "default", "--condition", "h12", "--seeds", "700"])
    assert (llm.hidden, llm.vocab, llm.warmup_steps, llm.warmup_lr, llm.lr, llm.max_completion_length,
            llm.reuse_warmup, llm.seeds) == (None, None, None, 1e-3, 1e-4, 16, True, [700])
    assert settings.default_results_dir(llm, [700]) == llm.output_dir  # not pre-registered: never results/


def test_critic_model_sets_the_ppo_arms_critic_only_with_model(tmp_path):
    with pytest.raises(ValueError, match="--critic_model policy applies with --model only"):
        settings.parse_args(["--critic_model", "policy"])
    folder = _tiny_model_folder(tmp_path / "policy")
    a = settings.parse_args(["--model", folder, "--condition", "h12", "--seeds", "700", "--critic_model", "policy"])
    ppo = runner.make_config(a, str(tmp_path / "run"), settings.ARMS["PPO"], 700)
    assert ppo.critic_model_name_or_path == folder  # 'policy': a second whole copy of the policy's model
    assert runner.make_config(a, str(tmp_path / "run"), settings.ARMS["GRPO"], 700).critic_model_name_or_path is None
    lora = settings.parse_args(["--model", folder, "--condition", "h12", "--seeds", "700"])
    assert runner.make_config(lora, str(tmp_path / "run"), settings.ARMS["PPO"], 700).critic_model_name_or_path is None
    # a run setting: runs made before the flag existed merge with runs at its default
    assert "critic_model" in settings.RUN_KEYS and settings.MAP_KEY_DEFAULTS["critic_model"] is None


def _tiny_model_folder(path):
    """A tiny Qwen2 + BPE tokenizer (tests/tiny_models.py) saved as a model folder, trained on corridor prompts."""
    from tiny_models import build_tiny_model, build_tiny_tokenizer

    a = settings.parse_args(["--length", "2", "--max_turns", "5", "--walk_turns", "6"])
    env, rng = testbeds.env_factory_for(a)(), random.Random(0)
    chat = build_tiny_tokenizer(["x"], vocab_size=300)
    texts = [chat.apply_chat_template(testbeds.random_prompt_messages(env, rng, range(100), 2, 6,
                                                                      testbeds.instruction_for(a), 5)[0],
                                      add_generation_prompt=True, tokenize=False) for _ in range(50)]
    texts += [testbeds.completion_text(w) + "<|im_end|>" for w in env.action_words] * 20
    tok = build_tiny_tokenizer(texts, vocab_size=400)
    build_tiny_model(tok, hidden_size=32, num_layers=2, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_model_path_runs_the_protocol_and_resumes_from_its_checkpoint(tmp_path, capsys):
    folder, out = _tiny_model_folder(tmp_path / "model"), tmp_path / "out"
    argv = ["--model", folder, "--seeds", "700", "701", "--arms", "GiGPO", "GRPO", "--length", "2", "--max_turns",
            "5", "--walk_turns", "6", "--iterations", "3", "--eval_every", "1", "--eval_every_early", "1", "--groups",
            "2", "--num_generations", "2", "--spg", "1", "--train_tasks", "8", "--eval_tasks", "4",
            "--warmup_episodes", "2", "--warmup_epochs", "1", "--workers", "1", "--output_dir", str(out)]
    assert runner.main(argv) == 0
    d = json.loads((out / "learning.json").read_text())
    assert sorted(d["arms"]) == ["GRPO", "GiGPO"] and d["seeds"] == [700, 701]
    assert d["tasks"] == {"train": 8, "held_out": 4, "shared": 0} and d["settings"]["eval_tasks"] == 4
    assert d["same_start"] == {"reference": "GRPO", "arms": ["GiGPO"], "per_seed": {}, "differing_seeds": []}
    assert d["model"]["path"] == folder and d["model"]["lora"] == {
        "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    assert not d["is_headline"] and not d["is_map_cell"] and {"command", "commit", "date", "machine"} <= set(d)
    for seed in ("700", "701"):
        # 2 expert episodes of 2 rooms: 2 turns each, 4 demonstration rows, 1 epoch at batch 1: 4 SFT steps
        w = d["warmup"][seed]
        assert (w["episodes"], w["rows"], w["success_rate"], w["sft_steps"]) == (2, 4, 1.0, 4)
    for run in d["runs"]:
        assert [p["iteration"] for p in run["points"]] == [0, 1, 2, 3]
        # the random tiny model never leaves room 2: 3 iterations x 2 groups x 2 rollouts x 5 turns, each
        # iteration's rollout logged (steps_per_generation 1: the evaluation's log once swallowed it)
        assert run["series"]["episode/success_rate"] == [0.0, 0.0, 0.0] and run["env_steps"] == 60
    lines = (out / "runs.jsonl").read_text().splitlines()
    dropped = json.loads(lines[-1])
    (out / "runs.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # as if cut after the last checkpoint
    capsys.readouterr()
    assert runner.main(argv) == 0
    printed = capsys.readouterr().out
    assert "skipped: seed 700 GRPO, seed 700 GiGPO, seed 701 GiGPO" in printed
    assert "warm-up adapter reused" in printed
    again = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert (again["seed"], again["arm"]) == (dropped["seed"], dropped["arm"])
    assert again["resumed_from"].endswith("checkpoint-3")
    assert again["points"] == dropped["points"] and again["series"] == dropped["series"]


def test_legal_door_demos_take_a_legal_door_drawn_from_task_and_turn_not_the_way():
    a = settings.parse_args(["--model", "default", "--seeds", "700", "--warmup_demos", "legal"])
    factory = testbeds.legal_demo_factory(testbeds.env_factory_for(a))
    env, plain = factory(), make()
    env.reset(task=5)
    plain.reset(task=5)
    assert env.render() == plain.render() == "room 1: left arch, right closet"
    first = env.expert_action()
    assert first in ("arch", "closet") and env.expert_action() == first  # the same draw for (task 5, turn 0)
    assert first == random.Random("5:0").choice(["arch", "closet"])
    on_path = total = 0
    for task in range(200):  # in rooms the draw is the passage about half the time: no preference taught
        env.reset(task=task)
        total += 1
        on_path += env.expert_action() == testbeds.DoorCorridor.expert_action(env)
    assert 80 < on_path < 120
    with pytest.raises(ValueError, match="--warmup_demos legal needs the corridor with door actions"):
        testbeds.legal_demo_factory(testbeds.env_factory_for(settings.parse_args(["--actions", "moves"])))

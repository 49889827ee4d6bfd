"""The learning benchmark's evaluation cost (benchmarks/learning/evaluation.py): ``--greedy_evals`` (greedy held-out
evaluations on the schedule, at the start only, or never) and ``--share_start_eval`` (a seed's iteration-0
evaluation made once, kept in its warm-up folder and reused by every arm of the seed). Split from
test_learning_testbed.py, whose fixtures (the tiny model folder, the hand-made runs) these tests reuse."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from learning import evaluation, runner, settings  # noqa: E402  (benchmarks/learning/)
from test_learning_testbed import _run, _tiny_model_folder, _write  # noqa: E402


def test_greedy_evals_choose_the_greedy_iterations_and_are_a_run_setting():
    schedule = [1, 2, 4, 6, 8]
    assert evaluation.greedy_iterations("schedule", schedule) == [0, 4, 6, 8]
    assert evaluation.greedy_iterations("start", schedule) == [0]
    assert evaluation.greedy_iterations("none", schedule) == []
    with pytest.raises(ValueError, match="greedy_evals"):
        evaluation.greedy_iterations("last", schedule)
    assert settings.parse_args([]).greedy_evals == "schedule" and "greedy_evals" in settings.RUN_KEYS
    assert settings.parse_args(["--greedy_evals", "none"]).greedy_evals == "none"
    # runs stored before the flag were made with greedy on the schedule
    assert settings.run_settings_filled({})["greedy_evals"] == "schedule"


def test_share_start_eval_is_refused_where_a_kept_evaluation_cannot_stand_for_the_arms_own():
    with pytest.raises(ValueError, match="clock nuisance"):
        settings.parse_args(["--condition", "clock", "--share_start_eval"])
    with pytest.raises(ValueError, match="--max_staleness 2"):
        settings.parse_args(["--condition", "h12", "--max_staleness", "2", "--share_start_eval"])
    assert settings.parse_args(["--condition", "h12", "--share_start_eval"]).share_start_eval


def test_runs_with_different_greedy_evals_refuse_to_merge(tmp_path):
    old = _write(tmp_path / "old", [_run(200, "GiGPO", 0.5, 0.0, 0.3), _run(200, "GRPO", 0.4, 0.0, 0.2)])
    schedule = _write(tmp_path / "schedule", [_run(201, "GRPO", 0.4, 0.0, 0.2) | {
        "run_settings": {"iterations": 30, "greedy_evals": "schedule"}}])
    assert sorted(runner.load_runs([old, schedule])) == [(200, "GRPO"), (200, "GiGPO"), (201, "GRPO")]
    start = _write(tmp_path / "start", [_run(202, "GRPO", 0.4, 0.0, 0.2) | {
        "run_settings": {"iterations": 30, "greedy_evals": "start"}}])
    with pytest.raises(ValueError, match="different settings"):
        runner.load_runs([old, start])
    # a rerun into a folder of runs made with another --greedy_evals is refused, naming it
    a = settings.parse_args(["--greedy_evals", "none"])
    made = {k: getattr(a, k) for k in settings.RUN_KEYS} | {"greedy_evals": "schedule"}
    folder = _write(tmp_path / "rerun", [_run(200, "GRPO", 0.4, 0.0, 0.2) | {"run_settings": made}])
    with pytest.raises(ValueError, match=r"other settings \(greedy_evals; seed 200 GRPO\)"):
        runner.finished_runs(folder, a)
    a.greedy_evals = "schedule"
    assert list(runner.finished_runs(folder, a)) == [(200, "GRPO")]


def _no_greedy(run):
    """``run`` as --greedy_evals start makes it: greedy at iteration 0 only, no greedy headline."""
    return run | {"points": [run["points"][0]] + [{k: v for k, v in p.items() if k != "greedy"}
                                                   for p in run["points"][1:]],
                  "headline_greedy": None, "run_settings": {"iterations": 30, "greedy_evals": "start"}}


def test_report_with_greedy_absent_has_no_greedy_gap_and_no_zero(tmp_path, capsys):
    runs = [_no_greedy(_run(s, arm, v, 0.0, v)) for s, arm, v in (
        (200, "GiGPO", 0.5), (200, "GRPO", 0.4), (201, "GiGPO", 0.6), (201, "GRPO", 0.4))]
    out = tmp_path / "merged"
    assert runner.main(["--report_only", "--runs", _write(tmp_path / "a", runs), "--output_dir", str(out)]) == 0
    d = json.loads((out / "learning.json").read_text())
    assert d["settings"]["greedy_evals"] == "start"
    assert "GiGPO-GRPO/T=1" in d["gaps"] and "GiGPO-GRPO/AUC T=1" in d["gaps"]
    assert not any(k.endswith("/greedy") for k in d["gaps"])
    assert d["gap_pp"] == pytest.approx(15.0)
    assert d["per_seed"]["200"]["GiGPO"]["headline_greedy"] is None  # absent, not 0
    assert "absent from the runs (not evaluated; --greedy_evals start): greedy" in d["table"]
    assert "0.000" not in d["table"].split("\n")[3]  # seed 200's row: "-" where greedy would be
    assert (out / "learning_curve.png").exists()


def test_kept_start_eval_is_reused_only_with_the_same_key(tmp_path):
    import torch

    init = tmp_path / "seed700" / "init"
    init.mkdir(parents=True)
    (init / "adapter_model.safetensors").write_bytes(b"weights")
    a = settings.parse_args(["--seeds", "700", "--share_start_eval"])
    kept = evaluation.KeptStartEval(a, 700, init, greedy=True)
    assert kept.load() is None
    torch.manual_seed(3)
    kept.save({"iteration": 0, "sampled": 0.25, "sampled_length": 4.25})
    after = torch.rand(3)
    torch.manual_seed(99)
    assert evaluation.KeptStartEval(a, 700, init, greedy=True).load()["sampled"] == 0.25
    assert torch.equal(torch.rand(3), after)  # the random state right after the evaluation is restored
    assert evaluation.KeptStartEval(a, 701, init, greedy=True).load() is None  # another seed
    assert evaluation.KeptStartEval(a, 700, init, greedy=False).load() is None  # greedy not evaluated at 0
    for key, value in (("eval_tasks", 32), ("sampled_eval_temperature", 0.5), ("history_length", 1)):
        other = settings.parse_args(["--seeds", "700", "--share_start_eval"])
        setattr(other, key, value)
        assert evaluation.KeptStartEval(other, 700, init, greedy=True).load() is None, key
    (init / "adapter_model.safetensors").write_bytes(b"other weights")  # a new warm-up in the same folder
    assert evaluation.KeptStartEval(a, 700, init, greedy=True).load() is None


def _without_clocks(series: dict) -> str:
    """The training series but their timings, as JSON text (nan, PPO's undefined explained variance, equals itself)."""
    return json.dumps({k: v for k, v in series.items() if not k.endswith("seconds")}, sort_keys=True)


def test_arms_of_a_seed_share_its_iteration0_evaluation_and_it_equals_their_own(tmp_path, capsys):
    """GRPO evaluates iteration 0 and keeps it; PPO and RLOO of the seed reuse it. Run again without sharing, PPO
    and RLOO evaluate themselves: the same values (sampled success, lengths, invalid rate: at T = 0.02 the tiny
    model's draws decide them), and the same runs after, since the random state after the evaluation is kept."""
    folder = _tiny_model_folder(tmp_path / "model")
    # 30 epochs at 3e-2: a tiny model whose greedy door is often right and whose draws at T = 0.02 vary
    common = ["--model", folder, "--seeds", "700", "--length", "2", "--max_turns", "5", "--walk_turns", "6",
              "--iterations", "3", "--eval_every", "1", "--eval_every_early", "1", "--groups", "2",
              "--num_generations", "2", "--spg", "1", "--train_tasks", "8", "--eval_tasks", "8",
              "--sampled_eval_temperature", "0.02", "--warmup_episodes", "2", "--warmup_epochs", "30",
              "--warmup_lr", "3e-2", "--workers", "1", "--greedy_evals", "start",
              "--warmup_dir", str(tmp_path / "warm")]
    shared, fresh = tmp_path / "shared", tmp_path / "fresh"
    assert runner.main(common + ["--arms", "GRPO", "PPO", "RLOO", "--share_start_eval", "--output_dir",
                                 str(shared)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("it 0: kept evaluation start_eval_") == 2
    runs = runner.load_runs([shared / "runs.jsonl"])
    kept_files = list((tmp_path / "warm" / "seed700" / "init").glob("start_eval_*.json"))
    assert len(kept_files) == 1
    kept = json.loads(kept_files[0].read_text())["point"]
    assert kept == runs[(700, "GRPO")]["points"][0]
    assert 0 < kept["sampled"] < 1 and 0 < kept["sampled_invalid"] < 1 and "greedy" in kept  # not a trivial point
    assert [runs[(700, arm)]["start_eval"] for arm in ("GRPO", "PPO", "RLOO")] == ["own", "kept", "kept"]
    for run in runs.values():  # --greedy_evals start: greedy at iteration 0 only, no greedy headline
        assert [("greedy" in p) for p in run["points"]] == [True, False, False, False]
        assert run["headline_greedy"] is None
    d = json.loads((shared / "learning.json").read_text())
    assert d["same_start"]["differing_seeds"] == [] and not any(k.endswith("/greedy") for k in d["gaps"])

    assert runner.main(common + ["--arms", "PPO", "RLOO", "--output_dir", str(fresh)]) == 0
    own = runner.load_runs([fresh / "runs.jsonl"])
    for arm in ("PPO", "RLOO"):
        assert own[(700, arm)]["start_eval"] == "own"
        assert own[(700, arm)]["points"][0] == kept  # the arm's own evaluation is the kept one, value for value
        assert own[(700, arm)]["points"] == runs[(700, arm)]["points"]
        assert _without_clocks(own[(700, arm)]["series"]) == _without_clocks(runs[(700, arm)]["series"])

    # a kept evaluation made with other settings (greedy at iteration 0) is not reused: GRPO evaluates itself
    capsys.readouterr()
    assert runner.main(common[:-4] + ["--greedy_evals", "none", "--warmup_dir", str(tmp_path / "warm"), "--arms",
                                      "GRPO", "--share_start_eval", "--output_dir", str(tmp_path / "none")]) == 0
    assert "kept evaluation" not in capsys.readouterr().out
    none = runner.load_runs([tmp_path / "none" / "runs.jsonl"])[(700, "GRPO")]
    assert none["start_eval"] == "own" and not any("greedy" in p for p in none["points"])
    assert none["points"][0]["sampled"] == kept["sampled"]  # greedy decoding draws nothing: sampled unchanged
    assert len(list((tmp_path / "warm" / "seed700" / "init").glob("start_eval_*.json"))) == 2

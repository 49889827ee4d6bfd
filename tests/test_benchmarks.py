"""The scripts of benchmarks/ and scripts/ cannot rot unseen: each answers ``--help`` (so it still imports and its
command line still builds), without importing torch, transformers or TRL first (so ``--help`` and a bad flag answer
at once); the shell scripts answer ``--help`` too."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULES = {"benchmarks/results_io.py",  # imported by the scripts, not run
           "scripts/mkdocs_hooks.py",  # loaded by `mkdocs build` (mkdocs.yml's hooks), not run
           "scripts/results_tables.py"}  # imported by scripts/gen_results.py, not run
SCRIPTS = sorted(str(p.relative_to(REPO)) for folder in ("benchmarks", "scripts") for p in (REPO / folder).glob("*.py")
                 if str(p.relative_to(REPO)) not in MODULES)
SHELL_SCRIPTS = sorted(str(p.relative_to(REPO)) for p in (REPO / "scripts").glob("*.sh"))
HEAVY = {"torch", "transformers", "trl", "datasets", "peft", "vllm", "accelerate"}
# Scripts whose parser is built from a heavy package, and why.
HEAVY_BEFORE_ARGPARSE = {
    "scripts/vllm_serve_cpu.py": "its parser is TRL's own vllm-serve parser (trl's top-level import is lazy)",
}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _imported(importtime_log: str) -> set[str]:
    """Top-level module names from ``python -X importtime``'s log (``import time: self | cumulative | name``)."""
    names = set()
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize("script", SCRIPTS + SHELL_SCRIPTS)
def test_every_script_answers_help_before_heavy_imports(script):
    command = ["bash", script] if script.endswith(".sh") else [sys.executable, "-X", "importtime", script]
    done = subprocess.run([*command, "--help"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{script} --help exited {done.returncode}:\n{done.stderr[-2000:]}"
    assert Path(script).name in done.stdout, f"{script} --help does not name the script:\n{done.stdout[:500]}"
    if script.endswith(".py") and script not in HEAVY_BEFORE_ARGPARSE:
        heavy = sorted(_imported(done.stderr) & HEAVY)
        assert not heavy, f"{script} --help imports {heavy} before parsing its command line"


def test_importtime_log_is_read_as_top_level_names():
    log = ("import time: self [us] | cumulative | imported package\n"
           "import time:       120 |        120 |   torch._C\n"
           "import time:        80 |        300 | numpy\n")
    assert _imported(log) == {"imported package", "torch", "numpy"}


# ------------------------------------------------------------------------------------------ results files and pages
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))
import bench_vs_trl  # noqa: E402  (benchmarks/bench_vs_trl.py)
import gen_results  # noqa: E402  (scripts/gen_results.py)
import report_screenshot  # noqa: E402  (scripts/report_screenshot.py)
import results_io  # noqa: E402  (benchmarks/results_io.py)

RESULT_FILES = sorted([*(REPO / "benchmarks" / "results").glob("*.json"), REPO / "benchmarks/results/map/map.json"])


def test_pages_agree_with_the_results_files():
    """README's headline table and the results pages are what scripts/gen_results.py writes from the results."""
    assert gen_results.main(["--check"]) == 0, "run python scripts/gen_results.py"


def test_a_changed_figure_makes_the_pages_stale(tmp_path, monkeypatch, capsys):
    for path in RESULT_FILES:
        target = tmp_path / path.relative_to(REPO / "benchmarks" / "results")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    rollout = json.loads((tmp_path / "bench_rollout.json").read_text())
    rollout["figures"]["ratio_greedy"] = 1.234
    (tmp_path / "bench_rollout.json").write_text(json.dumps(rollout))
    monkeypatch.setattr(gen_results, "RESULTS", tmp_path)
    assert "| rollout overhead vs the bare generate calls | 1.23× |" in gen_results.headline_table()
    assert gen_results.main(["--check"]) == 1
    assert "README.md" in capsys.readouterr().out


def test_figure_formats_by_hand():
    assert gen_results.gap({"gap_pp": 2.96875, "ci95_pp": [-1.873, 7.81]}, " pp") == "+3.0 pp [\u22121.9, +7.8]"
    assert gen_results.signed(-0.04) == "0.0" and gen_results.signed(-2.25) == "\u22122.2"


def test_bench_vs_trl_unique_tokens_count_a_prompt_shared_across_groups_once():
    """The denominator of forwarded-per-unique is every distinct token prefix of the iteration's rows, whichever group
    each row is in: two groups whose tasks share a prompt (the forward computes it once) count it once."""
    prompt = [7, 8, 9]
    rows = [prompt + [1, 2], prompt + [1, 2, 3, 4], prompt + [5], prompt + [5, 6]]  # groups A, A, B, B
    assert bench_vs_trl.count_unique(rows) == 3 + 2 + 2 + 1 + 1


def test_g2po_table_shows_folded_cells_and_pending_ones(tmp_path, monkeypatch):
    g = {"gap_pp": 2.0, "ci95_pp": [-1.0, 5.0]}
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "map.json").write_text(json.dumps({
        "gaps_to_grpo": {c: ({"G2PO": g} if c in ("h12", "clock_sim") else {}) for c in gen_results.MAP_CELLS},
        "gaps_between": {"h12": {"G2PO-GraphGPO": g | {"gap_pp": -3.0}, "G2PO-GiGPO": g},
                         "clock_sim": {"G2PO-GiGPO": g}},  # clock_sim has no GraphGPO arm
        "pending": {c: ["G2PO"] for c in gen_results.MAP_CELLS if c not in ("h12", "clock_sim")}}))
    (tmp_path / "learning.json").write_text(json.dumps({"gaps": {"GiGPO-GRPO/T=1": g}}))
    monkeypatch.setattr(gen_results, "RESULTS", tmp_path)
    rows = gen_results.g2po_table().splitlines()
    assert rows[3] == "| `h12` (12 rooms; exact anchors; diffuse failure) | 600-607 | +2.0 [\u22121.0, +5.0] | " \
                      "\u22123.0 [\u22121.0, +5.0] | +2.0 [\u22121.0, +5.0] |"
    assert rows[2].endswith("| pending | pending | pending |")  # h6
    assert rows[6].endswith("| +2.0 [\u22121.0, +5.0] | no GraphGPO arm | +2.0 [\u22121.0, +5.0] |")  # clock_sim
    assert rows[-1] == "| headline corridor (12 rooms) | 200-209 | pending | pending | pending |"


def _results_copy(tmp_path, monkeypatch, skip=()) -> Path:
    """benchmarks/results/ copied under ``tmp_path`` (less the files named in ``skip``), read by gen_results."""
    for path in RESULT_FILES:
        if path.name in skip:
            continue
        target = tmp_path / path.relative_to(REPO / "benchmarks" / "results")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    monkeypatch.setattr(gen_results, "RESULTS", tmp_path)
    return tmp_path


def test_baseline_arms_render_where_run_and_pending_elsewhere(tmp_path, monkeypatch):
    """RLOO and PPO in one map cell (h12) and one headline pair: their gaps in the baselines, map and learning
    tables and README's headline; every other cell and pair "pending", though map.json lists no arm as pending
    (written before the two arms were pre-registered)."""
    res = _results_copy(tmp_path, monkeypatch, skip=("bench_estimator_cost.json", "bench_estimator_cost_llm.json"))
    m = json.loads((res / "map" / "map.json").read_text())
    rloo, ppo = {"gap_pp": 0.4, "ci95_pp": [-2.0, 2.8]}, {"gap_pp": -3.25, "ci95_pp": [-6.0, -0.5]}
    for cell in m["gaps_to_grpo"]:  # the baselines in h12 only, whatever cells the recorded map has folded
        m["gaps_to_grpo"][cell] = {k: v for k, v in m["gaps_to_grpo"][cell].items() if k not in ("RLOO", "PPO")}
        m["gaps_between"][cell] = {k: v for k, v in m["gaps_between"].get(cell, {}).items()
                                   if k.split("-")[0] not in ("RLOO", "PPO")}
    m["gaps_to_grpo"]["h12"] |= {"RLOO": rloo, "PPO": ppo}
    m["gaps_between"]["h12"] |= {"PPO-GiGPO": {"gap_pp": -4.9, "ci95_pp": [-8.1, -1.7]}, "RLOO-GiGPO": rloo}
    m["pending"] = {}
    m["baselines"] = {"h12": {"grpo_rerun_minus_recorded": {"gap_pp": 1.5, "ci95_pp": [-0.5, 3.5]},
                              "ppo_critic": {"seeds": 8, "explained_variance_first": -4.9224,
                                             "explained_variance_last3": -0.0303, "value_error_first": 0.99,
                                             "value_error_last3": 0.486}}}
    (res / "map" / "map.json").write_text(json.dumps(m))
    learning = json.loads((res / "learning.json").read_text())
    learning["gaps"] |= {"RLOO-GRPO/T=1": rloo, "RLOO-GRPO/AUC T=1": ppo, "RLOO-GRPO/greedy": rloo}
    (res / "learning.json").write_text(json.dumps(learning))

    rows = gen_results.baselines_table().splitlines()
    assert rows[0] == ("| cell | seeds | RLOO \u2212 GRPO (primary) | PPO \u2212 GRPO (primary) | PPO \u2212 GiGPO | "
                       "PPO \u2212 G2PO | RLOO \u2212 GiGPO | GRPO re-run \u2212 recorded | PPO's critic: explained "
                       "variance, first \u2192 last 3 iterations |")
    assert rows[3] == ("| `h12` (12 rooms; exact anchors; diffuse failure) | 600-607 | +0.4 [\u22122.0, +2.8] | "
                       "\u22123.2 [\u22126.0, \u22120.5] | \u22124.9 [\u22128.1, \u22121.7] | pending | "
                       "+0.4 [\u22122.0, +2.8] | +1.5 [\u22120.5, +3.5] | \u22124.92 \u2192 \u22120.03 (error "
                       "0.49) |")
    assert rows[2] == ("| `h6` (6 rooms) | 600-607 | pending | pending | pending | pending | pending | pending | "
                       "pending |")
    assert rows[-1] == ("| headline corridor (12 rooms) | 200-209 | +0.4 [\u22122.0, +2.8] | pending | pending | "
                        "pending | pending | pending | pending |")
    table = gen_results.map_table().splitlines()
    assert table[0].endswith("| G2PO \u2212 GRPO | RLOO \u2212 GRPO | PPO \u2212 GRPO |")
    assert table[3].endswith("| +0.4 [\u22122.0, +2.8] | \u22123.2 [\u22126.0, \u22120.5] |")  # h12
    assert table[6].endswith("| not an arm | +9.0 [+6.5, +11.5] | pending | pending |")  # clock_sim: no GraphGPO
    learning_rows = gen_results.learning_table().splitlines()
    assert ("| RLOO \u2212 GRPO | +0.4 [\u22122.0, +2.8] | \u22123.2 [\u22126.0, \u22120.5] | "
            "+0.4 [\u22122.0, +2.8] |") in learning_rows
    assert "| PPO \u2212 G2PO | pending | pending | pending |" in learning_rows
    headline = gen_results.headline_table()
    assert "; RLOO +0.4 [\u22122.0, +2.8]; PPO pending |" in headline
    assert ("; RLOO +0.4 [\u22122.0, +2.8] in 1 of 7 cells (against GRPO re-run beside it); PPO \u22123.2 "
            "[\u22126.0, \u22120.5] in 1 of 7 cells (against GRPO re-run beside it) |") in headline
    assert "| pending (`python benchmarks/bench_estimator_cost.py` not recorded yet) |" in headline


def test_headline_baselines_come_from_their_own_grpo_rerun(tmp_path, monkeypatch):
    """The headline's RLOO and PPO gaps are read from map_baselines/headline (paired with the GRPO re-run there),
    and that GRPO is compared with the recorded one seed by seed; nothing else of that report is folded in."""
    res = _results_copy(tmp_path, monkeypatch)
    recorded = {r["seed"]: r["headline_sampled"] for r in gen_results.load("learning")["runs"] if r["arm"] == "GRPO"}
    ppo = {"gap_pp": -2.5, "ci95_pp": [-4.0, -1.0]}
    (res / "map_baselines" / "headline").mkdir(parents=True)
    (res / "map_baselines" / "headline" / "learning.json").write_text(json.dumps({
        "gaps": {"PPO-GRPO/T=1": ppo, "GiGPO-GRPO/T=1": {"gap_pp": 99.0, "ci95_pp": [98.0, 100.0]}},
        "runs": [{"arm": "GRPO", "seed": 200, "headline_sampled": recorded[200] + 0.05},
                 {"arm": "GRPO", "seed": 201, "headline_sampled": recorded[201] - 0.01}]}))
    gaps = gen_results.headline_gaps()
    assert gaps["PPO-GRPO/T=1"] == ppo and gaps["GiGPO-GRPO/T=1"]["gap_pp"] != 99.0
    rerun = gen_results.headline_rerun()
    assert rerun["per_seed_pp"] == pytest.approx({"200": 5.0, "201": -1.0}) and rerun["gap_pp"] == pytest.approx(2.0)
    # sd of (5, -1) = 4.243, half-width 12.706 * 4.243 / sqrt(2) = 38.12
    assert rerun["ci95_pp"] == pytest.approx([2.0 - 38.12, 2.0 + 38.12], abs=0.01)
    assert gen_results.baselines_table().splitlines()[-1] == (
        "| headline corridor (12 rooms) | 200-209 | pending | \u22122.5 [\u22124.0, \u22121.0] | pending | pending | "
        "pending | +2.0 [\u221236.1, +40.1] | pending |")


def test_cost_table_from_its_file_and_a_line_without_it(tmp_path, monkeypatch):
    res = _results_copy(tmp_path, monkeypatch, skip=("bench_estimator_cost.json", "bench_estimator_cost_llm.json"))
    page = (REPO / "benchmarks/experiments/baselines_arm.md").read_text()
    rendered = gen_results.render("benchmarks/experiments/baselines_arm.md", page)  # no file: no failure
    assert "<!-- results:cost -->\nNot recorded yet: `python benchmarks/bench_estimator_cost.py` writes" in rendered

    def arm(peak, cpu, **more):
        return {"seed": 600, "iterations": 10, "peak_rss_mb": peak, "train_wall_seconds_per_iteration": cpu + 0.5,
                "train_cpu_seconds_per_iteration": cpu, "rollout_seconds_per_iteration": 2.0,
                "advantage_seconds_per_iteration": 0.0061, "rest_seconds_per_iteration": 1.25,
                "rows_per_iteration": 512.4, "held_out_success_last3": 0.8125, "load": [2.1, 2.34],
                "policy_params": 101_234} | more
    (res / "bench_estimator_cost.json").write_text(json.dumps({
        "benchmark": "bench_estimator_cost", "command": "python benchmarks/bench_estimator_cost.py",
        "commit": "abc1234", "date": "2026-01-02", "machine": "test box",
        "figures": {"condition": "h12", "seed": 600, "arms": {
            "GRPO": arm(800.0, 3.3), "PPO": arm(1200.4, 4.5, critic_params=100_000)}}}))
    rows = gen_results.cost_table().splitlines()
    assert rows[2] == ("| GRPO | 800 | \u2014 | 3.80 (3.30) | 2.00 | 0.0061 | 1.25 | 512 | 0.812 | 101,234 | "
                       "2.10 \u2192 2.34 |")
    assert rows[3] == ("| PPO | 1,200 | +400 MB (+50 %) | 5.00 (4.50) | 2.00 | 0.0061 | 1.25 | 512 | 0.812 | "
                       "101,234 + critic 100,000 | 2.10 \u2192 2.34 |")
    assert rows[-1] == ("Cell `h12`, seed 600, 10 iterations, one run per arm in turn from one warm-up: "
                        "`python benchmarks/bench_estimator_cost.py` at commit abc1234, 2026-01-02, `test box`.")
    assert ("| peak RSS GRPO 800, PPO 1,200 MB; training CPU s per iteration 3.30 / 4.50 (`h12`, seed 600, one run "
            "each) |") in gen_results.headline_table()
    # the LLM record (--model): its own block, the trained parameters beside the whole
    res_llm = res / "bench_estimator_cost_llm.json"
    assert "| pending (`python benchmarks/bench_estimator_cost.py --arms ... PPO PPO-whole -- --model default" in (
        gen_results.headline_table())
    assert "<!-- results:cost_llm -->\nNot recorded yet: `python benchmarks/bench_estimator_cost.py --arms" in (
        gen_results.render("benchmarks/experiments/baselines_arm.md", page))
    res_llm.write_text(json.dumps({
        "benchmark": "bench_estimator_cost_llm", "command": "python benchmarks/bench_estimator_cost.py -- --model x",
        "commit": "abc1234", "date": "2026-01-02", "machine": "test box",
        "figures": {"condition": "h12", "seed": 800, "arms": {
            "GRPO": arm(2000.0, 200.0, policy_params=135_000_000, policy_trainable_params=920_000),
            "PPO-whole": arm(4200.0, 400.0, policy_params=135_000_000, policy_trainable_params=920_000,
                             critic_trainable_params=134_500_577)}}}))
    rows = gen_results.cost_llm_table().splitlines()
    assert ("| peak RSS GRPO 2,000, PPO-whole 4,200 MB; training CPU s per iteration 200.00 / 400.00 (`h12`, seed "
            "800, one run each) |") in gen_results.headline_table()  # README's row for the LLM
    assert rows[-1].endswith("`test box`.")  # arms without their own commit: the record's
    llm = json.loads(res_llm.read_text())
    llm["figures"]["arms"]["GRPO"] |= {"commit": "0ld1234", "date": "2026-01-01"}
    llm["figures"]["arms"]["PPO-whole"] |= {"commit": "abc1234", "date": "2026-01-02"}
    res_llm.write_text(json.dumps(llm))
    assert gen_results.cost_llm_table().splitlines()[-1].endswith(
        "`test box`. Arms measured at: GRPO at 0ld1234 (2026-01-01); PPO-whole at abc1234 (2026-01-02).")
    assert rows[3] == ("| PPO-whole | 4,200 | +2200 MB (+110 %) | 400.50 (400.00) | 2.00 | 0.0061 | 1.25 | 512 | "
                       "0.812 | 920,000 of 135,000,000 trained + critic 134,500,577 | 2.10 \u2192 2.34 |")


def test_estimator_cost_rerun_keeps_the_arms_already_measured(tmp_path, monkeypatch):
    """bench_estimator_cost.py resumes: a rerun of the same command runs only the warm-up and the arms not yet in
    OUTPUT_DIR/arms.json, and records every arm in the order asked; another command starts afresh."""
    import bench_estimator_cost as bench
    import results_io

    calls, written = [], []

    def child(cmd, log):
        calls.append(cmd[cmd.index("--arms") + 1] + (" warm-up" if "--warmup_only" in cmd else ""))
        return 0, 100.0 + len(calls), 1.0

    keys = ("train_wall_seconds_per_iteration", "train_cpu_seconds_per_iteration", "rollout_seconds_per_iteration",
            "advantage_seconds_per_iteration", "rest_seconds_per_iteration", "rows_per_iteration",
            "held_out_success_last3")
    monkeypatch.setattr(bench, "run_child", child)
    monkeypatch.setattr(bench, "arm_figures", lambda arm, out, seed, peak, wall, loads: {
        "peak_rss_mb": peak, "load": [1.0, 1.0], **dict.fromkeys(keys, 1.0)})
    monkeypatch.setattr(bench, "model_sizes", lambda init, fields: {})
    monkeypatch.setattr(results_io, "write_result", lambda name, figures, recorded: written.append(figures))
    out = str(tmp_path / "cost")
    assert bench.main(["--arms", "GRPO", "RLOO", "--output_dir", out]) == 0
    assert calls == ["GRPO warm-up", "GRPO", "RLOO"]
    calls.clear()
    assert bench.main(["--arms", "PPO", "GRPO", "RLOO", "--output_dir", out]) == 0
    assert calls == ["PPO warm-up", "PPO"]  # GRPO and RLOO kept, with their figures
    assert list(written[-1]["arms"]) == ["PPO", "GRPO", "RLOO"]
    assert [written[-1]["arms"][arm]["peak_rss_mb"] for arm in ("GRPO", "RLOO")] == [102.0, 103.0]
    calls.clear()
    assert bench.main(["--arms", "GRPO", "--iterations", "3", "--output_dir", out]) == 0
    assert calls == ["GRPO warm-up", "GRPO"]  # another command: nothing kept


def test_llm_study_table_and_readme_row_from_its_report(tmp_path, monkeypatch):
    """benchmarks/experiments/llm_learning.md's table and README's row: "pending" without the report; from it, the
    pre-registered gaps with their intervals and per arm the seeds' means (hand-computed)."""
    res = _results_copy(tmp_path, monkeypatch)
    assert gen_results.llm_row().startswith("pending: the pre-registered runs")
    assert gen_results.llm_table().startswith("pending: ")

    def run(arm, seed, start, last3, cpu, peak):
        return {"arm": arm, "seed": seed, "points": [{"iteration": 0, "sampled": start}], "headline_sampled": last3,
                "train_cpu_seconds_per_iteration": cpu, "peak_rss_mb": peak}
    g = lambda m, lo, hi: {"gap_pp": m, "ci95_pp": [lo, hi]}  # noqa: E731
    report = {"command": "python benchmarks/learning.py --model default", "commit": "abc1234", "date": "2026-01-02",
              "machine": "test box", "seeds": [800, 801], "arms": {"GRPO": {}, "GiGPO": {}, "G2PO": {}},
              "gaps": {"GiGPO-GRPO/T=1": g(3.125, -1.0, 7.25), "GiGPO-GRPO/AUC T=1": g(1.0, -2.0, 4.0),
                       "G2PO-GRPO/T=1": g(-2.0, -9.5, 5.5), "G2PO-GRPO/AUC T=1": g(0.0, -1.0, 1.0)},
              "runs": [run("GRPO", 800, 0.25, 0.5, 230.0, 2200.0), run("GRPO", 801, 0.125, 0.25, 240.0, 2300.0),
                       run("GiGPO", 800, 0.25, 0.5, 231.0, 2210.0), run("GiGPO", 801, 0.125, 0.3125, 241.0, 2310.0),
                       run("G2PO", 800, 0.25, 0.5, 232.0, 2220.0), run("G2PO", 801, 0.125, 0.25, 242.0, 2320.0)]}
    (res / "llm_learning" / "h12").mkdir(parents=True)
    (res / "llm_learning" / "h12" / "learning.json").write_text(json.dumps(report))
    rows = gen_results.llm_table().splitlines()
    assert rows[2] == "| GiGPO \u2212 GRPO | +3.1 pp [\u22121.0, +7.2] | +1.0 pp [\u22122.0, +4.0] |"
    assert rows[4] == "| G2PO \u2212 GiGPO | pending | pending |"
    assert rows[9] == "| GiGPO | 0.188 | 0.406 | 236 | 2,310 |"
    assert rows[-1] == ("Seeds 800, 801 (means over them); `python benchmarks/learning.py --model default` at commit "
                        "abc1234, 2026-01-02, `test box`.")
    assert gen_results.llm_row() == ("GiGPO \u2212 GRPO +3.1 pp [\u22121.0, +7.2]; G2PO \u2212 GRPO \u22122.0 pp "
                                     "[\u22129.5, +5.5] (2 seeds)")


# ------------------------------------------------------------------------------------- README's report screenshot
def test_report_screenshot_is_of_the_run_readme_quotes(capsys):
    """docs/images/report_main_job.png is the image its record (report_main_job.json) describes, taken after that
    run finished, and README's and benchmarks/results/main_job.json's main-job figures are that run's."""
    assert report_screenshot.main(["--check"]) == 0, capsys.readouterr().err


def test_report_screenshot_check_names_each_disagreement():
    record = json.loads(report_screenshot.RECORD.read_text())
    image, readme = report_screenshot.IMAGE.read_bytes(), (REPO / "README.md").read_text()
    results = json.loads(report_screenshot.RESULTS.read_text())
    assert report_screenshot.check(record, image, readme, results) == []

    def problems(**changed):
        args = {"record": record, "image": image, "readme": readme, "results": results, **changed}
        return report_screenshot.check(**args)

    assert "describes another image" in problems(image=image + b"\0")[0]  # an image replaced without its record
    finished = datetime.datetime.fromisoformat(record["run"]["finished"])
    early = (finished - datetime.timedelta(seconds=1)).isoformat()  # a screenshot of an earlier run's report
    assert "before the run it claims finished" in problems(record={**record, "taken": early})[0]
    warmup = f"**{record['figures']['success']['after_warmup']:.3f} after the warm-up**"
    assert warmup in readme
    assert problems(readme=readme.replace(warmup, "**0.999 after the warm-up**"))[0].startswith(
        "README.md quotes {'success': {'before': 0.0, 'after_warmup': 0.999,")
    score = f"→ {record['figures']['task_score']['after']:.3f}"
    assert score in readme and "README.md quotes" in problems(readme=readme.replace(score, "→ 0.001"))[0]
    assert "no longer quotes" in problems(readme=readme.replace("task score", "score"))[0]
    other = json.loads(json.dumps(results))
    other["figures"]["success"]["after_gigpo"] = 0.5
    assert problems(results=other)[0].startswith("benchmarks/results/main_job.json has {'success': {'before': 0.0, "
                                                 "'after_warmup': 0.167, 'after': 0.5}")


def test_report_screenshot_reads_a_runs_three_evaluations():
    evals = {phase: {"success_rate": rate, "task_score": score, "num_tasks": 30.0} for phase, rate, score in
             (("before", 0.0, 0.0), ("after_warmup", 5 / 30, 0.7050000000000001), ("after", 6 / 30, 0.71722))}
    assert report_screenshot.run_figures(evals) == {
        "success": {"before": 0.0, "after_warmup": 0.167, "after": 0.2},
        "task_score": {"before": 0.0, "after_warmup": 0.705, "after": 0.717}, "eval_goals": 30}
    with pytest.raises(KeyError, match="no 'after_warmup' evaluation"):
        report_screenshot.run_figures({"before": evals["before"], "after": evals["after"]})


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_results_file_names_its_command_commit_date_and_machine(path):
    data = json.loads(path.read_text())
    missing = [key for key in results_io.PROVENANCE if not str(data.get(key, "")).strip()]
    assert not missing, f"{path.relative_to(REPO)} lacks {missing}"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", data["date"]) and re.search(r"\bpython|\bbash", data["command"])


def test_write_result_records_provenance_and_keeps_other_runs_out_of_the_record(tmp_path, monkeypatch):
    argv = [str(REPO / "benchmarks" / "bench_x.py"), "--calls", "3", "--name", "a b"]
    assert results_io.command_line(argv) == "python benchmarks/bench_x.py --calls 3 --name 'a b'"
    monkeypatch.setattr(results_io, "RESULTS", tmp_path / "record")
    monkeypatch.setattr(sys, "argv", argv)
    path = results_io.write_result("bench_x", {"ratio": 0.5}, recorded=False, folder=tmp_path / "scratch")
    assert path == tmp_path / "scratch" / "bench_x.json" and not (tmp_path / "record").exists()
    data = json.loads(path.read_text())
    assert data["figures"] == {"ratio": 0.5} and data["command"] == results_io.command_line(argv)
    assert data["commit"] == results_io.commit() != "unknown"
    recorded = results_io.write_result("bench_x", {"ratio": 0.5}, recorded=True)
    assert recorded == tmp_path / "record" / "bench_x.json"


def test_baselines_reading_ranges_over_the_cells_folded():
    """docs/estimators.md's reading of RLOO and PPO: each arm's range of gaps to GRPO and the critic's explained
    variance range over the folded cells (hand values); "pending" before PPO ran anywhere."""
    import results_tables as tables

    g = lambda m, lo, hi: {"gap_pp": m, "ci95_pp": [lo, hi]}  # noqa: E731
    critic = lambda first, last, err: {"explained_variance_first": first, "explained_variance_last3": last,  # noqa: E731
                                       "value_error_last3": err}
    m = {"gaps_to_grpo": {"h12": {"RLOO": g(-0.6, -2.9, 1.7), "PPO": g(-4.0, -8.9, 1.0)},
                          "trap": {"RLOO": g(2.8, -0.2, 5.9), "PPO": g(-1.3, -7.3, 4.7)}},
         "baselines": {"h12": {"ppo_critic": critic(-4.92, -0.03, 0.49)},
                       "trap": {"ppo_critic": critic(-9.31, -0.02, 0.38)}}}
    assert tables.baselines_reading(m) == (
        "So far: RLOO \u22120.6 to +2.8 in 2 of 7 cells, every interval across 0 (against GRPO re-run beside it); "
        "PPO \u22124.0 to \u22121.3 in 2 of 7 cells, every interval across 0 (against GRPO re-run beside it). PPO's "
        "critic, explained variance of its values at the first iteration \u22129.31 to \u22124.92, over the last 3 "
        "\u22120.03 to \u22120.02 (mean absolute value error 0.38 to 0.49), in 2 cells.")
    m["baselines"] = {}
    assert tables.baselines_reading(m).endswith("; PPO's critic pending.")


def test_llm_study_beside_the_tiny_policy_on_the_map_page():
    """map.md's comparison of the LLM study with the map's h12: each pre-registered gap from both reports (hand
    values), "pending" for the LLM before its report."""
    import results_tables as tables

    g = lambda m, lo, hi: {"gap_pp": m, "ci95_pp": [lo, hi]}  # noqa: E731
    m = {"gaps_to_grpo": {"h12": {"GiGPO": g(1.6, -1.2, 4.3), "G2PO": g(6.6, 3.8, 9.3)}},
         "gaps_between": {"h12": {"G2PO-GiGPO": g(5.0, 3.2, 6.8)}}}
    rows = tables.llm_vs_tiny(None, m).splitlines()
    assert rows[2] == "| GiGPO \u2212 GRPO | pending | +1.6 pp [\u22121.2, +4.3] |"
    report = {"seeds": [800, 801, 802, 803], "gaps": {"GiGPO-GRPO/T=1": g(-0.5, -3.0, 2.0),
                                                      "G2PO-GiGPO/T=1": g(2.2, 0.5, 4.0)}}
    rows = tables.llm_vs_tiny(report, m).splitlines()
    assert rows[2:5] == ["| GiGPO \u2212 GRPO | \u22120.5 pp [\u22123.0, +2.0] | +1.6 pp [\u22121.2, +4.3] |",
                         "| G2PO \u2212 GRPO | pending | +6.6 pp [+3.8, +9.3] |",
                         "| G2PO \u2212 GiGPO | +2.2 pp [+0.5, +4.0] | +5.0 pp [+3.2, +6.8] |"]
    assert rows[-1].endswith("the LLM over seeds 800-803, the tiny policy over seeds 600-607.")

"""The example job end to end on the tiny model: eval JSON, model card, adapter, offline Hub push."""

import json

from gigpo_trl.job import build_parser, model_card, run


def test_job_saves_everything_then_reports_failed_push(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "job"
    parser = build_parser({"env": "frozenlake"})
    job, args, model_args = parser.parse_args_and_config(args=[
        "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--lora_target_modules", "q_proj", "v_proj",
        "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_steps", "1", "--max_turns", "2",
        "--max_completion_length", "8", "--eval_max_tasks", "3", "--disable_tqdm", "true",
        "--push_to_hub", "true", "--hub_model_id", "someone/gigpo-test", "--hub_token", "hf_secret_not_printed",
    ])
    code = run(job, args, model_args)
    captured = capsys.readouterr()
    assert code == 1  # everything but the push succeeded
    results = json.loads((out / "eval_results.json").read_text())
    assert results["env"] == "frozenlake" and results["before"]["num_tasks"] == 3 == results["after"]["num_tasks"]
    assert 0.0 <= results["after"]["success_rate"] <= 1.0 and "success_rate/4x4" in results["after"]
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    card = (out / "README.md").read_text()
    assert f"base_model: {tiny_model_dir}" in card and "| step_advantage_weight | 1.0 |" in card
    assert "| before |" in card and "| after |" in card
    errors = [line for line in captured.err.splitlines() if line.startswith("[gigpo] push to the Hub failed")]
    assert len(errors) == 1 and f"saved in {out}" in errors[0]
    assert "[gigpo] success rate before:" in captured.out and "[gigpo] success rate after:" in captured.out
    assert "hf_secret_not_printed" not in captured.out + captured.err


def test_model_card_lists_settings_and_rates():
    class Args:
        step_advantage_weight, gamma, advantage_mode, episode_stats = 0.0, 0.95, "mean_norm", "rows"
        invalid_action_penalty, anchor_similarity_threshold, num_generations, max_turns = 0.1, None, 8, 50
        history_length, learning_rate, beta, max_steps, max_completion_length = 2, 1e-6, 0.01, 150, 512

    class Job:
        env, data_dir = "alfworld", None

    card = model_card("Qwen/Qwen2.5-1.5B-Instruct", Job(), Args(),
                      {"before": {"success_rate": 0.125, "num_tasks": 8}, "after": {"success_rate": 0.5,
                                                                                     "num_tasks": 8}})
    assert "base_model: Qwen/Qwen2.5-1.5B-Instruct" in card and "(bundled data)" in card
    assert "| step_advantage_weight | 0.0 |" in card and "| max_turns | 50 |" in card
    assert "| before | 0.125 | 8 |" in card and "| after | 0.500 | 8 |" in card

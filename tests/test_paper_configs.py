"""The paper configs (configs/*_paper*.yaml) against the mapping table in docs/paper_protocol.md."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ("alfworld_paper", "webshop_paper", "alfworld_paper_lora", "webshop_paper_lora")


def _table() -> dict[str, dict[str, object]]:
    """``{field: {config: value}}`` from the machine-checked table (``—``: the config has no such key)."""
    with open(os.path.join(REPO, "docs", "paper_protocol.md"), encoding="utf-8") as f:
        text = f.read()
    body = text.split("<!-- paper-config-table:start -->")[1].split("<!-- paper-config-table:end -->")[0]
    lines = [line for line in body.strip().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[1:5] == list(CONFIGS), header
    table = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        field = re.fullmatch(r"`([a-z_0-9]+)`", cells[0]).group(1)
        assert field not in table, f"{field} listed twice"
        table[field] = {}
        for name, cell in zip(CONFIGS, cells[1:5]):
            if cell != "—":
                table[field][name] = yaml.safe_load(re.fullmatch(r"`(.*)`", cell).group(1))
        assert cells[5], f"{field}: no verl-agent source"
    return table


def _config(name: str) -> dict:
    with open(os.path.join(REPO, "configs", f"{name}.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_matches_the_table(name):
    table, config = _table(), _config(name)
    expected = {field: values[name] for field, values in table.items() if name in values}
    assert sorted(config) == sorted(expected), "keys differ from the table"
    for key, value in config.items():
        assert value == expected[key] and type(value) is type(expected[key]), (key, value, expected[key])


@pytest.mark.parametrize("name", CONFIGS)
def test_config_keys_are_job_fields(name):
    from trl import ModelConfig

    from gigpo_trl.config import GiGPOConfig
    from gigpo_trl.job import JobArguments

    fields = {f.name for cls in (JobArguments, GiGPOConfig, ModelConfig) for f in dataclasses.fields(cls)}
    assert set(_config(name)) <= fields


@pytest.mark.parametrize("name", CONFIGS)
def test_paper_batch_arithmetic(name):
    """16 task groups x 8 rollouts = 128 trajectories per iteration on the paper's 2 GPUs; 150 iterations."""
    c = _config(name)
    processes = 2
    trajectories = c["per_device_train_batch_size"] * processes * c["steps_per_generation"]
    assert trajectories == 16 * 8 and c["num_generations"] == 8
    optimizer_steps_per_iteration = c["steps_per_generation"] // c["gradient_accumulation_steps"]
    assert c["max_steps"] == 150 * optimizer_steps_per_iteration == 2400
    # verl: ceil(R / ppo_mini_batch_size) steps; 16 matches R = 16 x 256 (ALFWorld) / 16 x 64 (WebShop) rows
    mini_batch = 256 if name.startswith("alfworld") else 64
    mean_turns = optimizer_steps_per_iteration * mini_batch / trajectories
    assert mean_turns == (32.0 if name.startswith("alfworld") else 8.0)
    assert c["protocol"] == "verl-agent" and c["paper_eval_episodes"] == 128 and c["paper_eval_temperature"] == 0.4
    full = not c["use_peft"]
    assert (c["learning_rate"], c["beta"]) == ((1e-6, 0.01) if full else (3e-6, 0.0))
    assert c["advantage_mode"] == ("mean_std_norm" if name.startswith("alfworld") else "mean_norm")

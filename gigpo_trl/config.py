"""GiGPOConfig: GRPOConfig plus the multi-turn rollout and GiGPO advantage settings."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

ADVANTAGE_MODES = ("mean_norm", "mean_std_norm")
EPISODE_STATS = ("rows", "trajectories")
STEP_GROUPINGS = ("state", "hierarchical")


@dataclass
class GiGPOConfig(GRPOConfig):
    r"""
    Configuration class for the [`GiGPOTrainer`].

    Every [`~trl.GRPOConfig`] parameter applies; the ones below are added or given other defaults. In GiGPO a
    *group* is `num_generations` rollouts of the same task from the same seed, and each (environment, turn) is one
    training row, so `per_device_train_batch_size × steps_per_generation` counts *trajectories* per process.

    Parameters:
        > Parameters that control the GiGPO advantage (arXiv 2505.10978, Sec. 3)

        step_advantage_weight (`float`, *optional*, defaults to `1.0`):
            ω in A = A_E + ω·A_S. `0.0` gives plain GRPO (episode-level advantage only), the baseline.
        gamma (`float`, *optional*, defaults to `0.95`):
            γ, discount of the step return G_t = r_t + γ·G_{t+1}. In [0, 1].
        advantage_mode (`str`, *optional*, defaults to `"mean_norm"`):
            Normalisation of both levels: `"mean_norm"` (x − mean) or `"mean_std_norm"` ((x − mean)/(std + 1e-6)).
        episode_stats (`str`, *optional*, defaults to `"rows"`):
            Episode-level group statistics over all rows of the group (`"rows"`, the reference's choice) or over
            one value per trajectory (`"trajectories"`).
        invalid_action_penalty (`float`, *optional*, defaults to `0.1`):
            Subtracted from the episode score and the step return of a row whose action could not be parsed or was
            rejected by the environment.
        anchor_similarity_threshold (`float` or `None`, *optional*, defaults to `None`):
            `None` groups rows whose anchor states are identical; a value in (0, 1) merges anchor texts at least
            that similar (see `compute_gigpo_advantages`).
        step_grouping (`str`, *optional*, defaults to `"state"`):
            Step groups of A_S: `"state"` (GiGPO: same anchor state) or `"hierarchical"` (HGPO, arXiv 2602.22817:
            nested groups that also share the last k = 1..`hierarchy_depth` turns of history, their advantages
            combined with weights ∝ (k+1)).
        hierarchy_depth (`int`, *optional*, defaults to `2`):
            K, the deepest history level of `step_grouping="hierarchical"`; `0` is GiGPO. Ignored for `"state"`.

        > Parameters that control the rollout

        max_turns (`int`, *optional*, defaults to `50`):
            T, the turn limit of an episode (an environment's own smaller limit wins).
        history_length (`int`, *optional*, defaults to `2`):
            k, the number of past observation/action pairs shown in each prompt.
        max_prompt_length (`int` or `None`, *optional*, defaults to `None`):
            Token limit of one turn's prompt; history is dropped (oldest first) to fit, then a `ValueError`.
            `None`: the model's context length minus `max_completion_length`.
        require_think (`bool`, *optional*, defaults to `True`):
            Whether a completion without a `<think>…</think>` block counts as an invalid action.
        num_env_workers (`int`, *optional*, defaults to `0`):
            Worker processes stepping the environments; `0` steps them in the training process.
        env_step_timeout (`float` or `None`, *optional*, defaults to `None`):
            Seconds an environment step may take in a worker before its trajectory is ended as failed.
        dynamic_sampling (`bool`, *optional*, defaults to `False`):
            Drop task groups whose trajectory returns are all equal (no episode-level signal) and roll out fresh
            tasks in their place, as DAPO does, up to `max_dynamic_sampling_rounds` extra rounds.
        max_dynamic_sampling_rounds (`int`, *optional*, defaults to `2`):
            Bound on the extra rollout rounds of `dynamic_sampling`.
        eval_temperature (`float`, *optional*, defaults to `0.0`):
            Sampling temperature of `evaluate()` episodes; `0.0` is greedy.
        eval_max_tasks (`int` or `None`, *optional*, defaults to `None`):
            Evaluate on at most this many tasks of the eval dataset (the first ones).
    """

    # GiGPO advantage
    step_advantage_weight: float = field(
        default=1.0,
        metadata={"help": "ω in A = A_E + ω·A_S. 0.0 gives plain GRPO (episode-level advantage only)."},
    )
    gamma: float = field(
        default=0.95, metadata={"help": "γ, discount of the step return G_t = r_t + γ·G_{t+1}. In [0, 1]."}
    )
    advantage_mode: str = field(
        default="mean_norm",
        metadata={"help": "Advantage normalisation: 'mean_norm' (x − mean) or 'mean_std_norm' ((x − mean)/(std + 1e-6)).",
                  "choices": list(ADVANTAGE_MODES)},
    )
    episode_stats: str = field(
        default="rows",
        metadata={"help": "Episode-level statistics over all rows of a group ('rows') or one value per trajectory "
                          "('trajectories').", "choices": list(EPISODE_STATS)},
    )
    invalid_action_penalty: float = field(
        default=0.1,
        metadata={"help": "Subtracted from the episode score and step return of a row with an invalid action."},
    )
    anchor_similarity_threshold: float | None = field(
        default=None,
        metadata={"help": "None: exact anchor-state match. A value in (0, 1): merge anchor texts at least that similar."},
    )
    step_grouping: str = field(
        default="state",
        metadata={"help": "Step groups of A_S: 'state' (GiGPO, same anchor state) or 'hierarchical' (HGPO: nested "
                          "groups that also share the last 1..hierarchy_depth turns of history).",
                  "choices": list(STEP_GROUPINGS)},
    )
    hierarchy_depth: int = field(
        default=2,
        metadata={"help": "K, the deepest history level of step_grouping='hierarchical'; 0 is GiGPO."},
    )
    # Rollout
    max_turns: int = field(default=50, metadata={"help": "T, the turn limit of an episode."})
    history_length: int = field(
        default=2, metadata={"help": "k, the number of past observation/action pairs shown in each prompt."}
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Token limit of one turn's prompt (history dropped first, then an error). None: the model's "
                          "context length minus max_completion_length."},
    )
    require_think: bool = field(
        default=True, metadata={"help": "Whether a completion without <think>…</think> counts as an invalid action."}
    )
    num_env_workers: int = field(
        default=0, metadata={"help": "Worker processes stepping the environments; 0 steps them in-process."}
    )
    env_step_timeout: float | None = field(
        default=None, metadata={"help": "Seconds an env step may take in a worker before its trajectory fails."}
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "Drop task groups whose returns are all equal and roll out fresh tasks instead (DAPO)."},
    )
    max_dynamic_sampling_rounds: int = field(
        default=2, metadata={"help": "Bound on the extra rollout rounds of dynamic_sampling."}
    )
    eval_temperature: float = field(
        default=0.0, metadata={"help": "Sampling temperature of evaluate() episodes; 0.0 is greedy."}
    )
    eval_max_tasks: int | None = field(
        default=None, metadata={"help": "Evaluate on at most this many tasks of the eval dataset."}
    )
    # Changed defaults: the global token mean fits a varying number of rows per iteration.
    loss_type: str = field(
        default="dapo",
        metadata={"help": "Loss aggregation; 'dapo' (global token mean) fits a varying number of rows per iteration."},
    )

    def __getstate__(self) -> dict:
        """Pickle without secrets: ``transformers.Trainer`` writes the whole config with ``torch.save`` into every
        checkpoint (``training_args.bin``, also pushed to the Hub), so ``hub_token`` (and any other ``*_token``
        string) is left out of the pickled copy; ``to_dict``/``str`` already mask it. The live object keeps it."""
        state = dict(self.__dict__)
        for key, value in state.items():
            if key.endswith("_token") and isinstance(value, str):
                state[key] = None
        return state

    def __post_init__(self):
        # Checked before GRPOConfig's own checks, which would divide by a zero num_generations.
        if not isinstance(self.num_generations, int) or self.num_generations < 2:
            raise ValueError(
                f"num_generations must be an int >= 2 (the rollouts per task group that GiGPO compares), got "
                f"{self.num_generations!r}"
            )
        super().__post_init__()
        if self.advantage_mode not in ADVANTAGE_MODES:
            raise ValueError(f"advantage_mode must be one of {list(ADVANTAGE_MODES)}, got {self.advantage_mode!r}")
        if self.episode_stats not in EPISODE_STATS:
            raise ValueError(f"episode_stats must be one of {list(EPISODE_STATS)}, got {self.episode_stats!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.anchor_similarity_threshold is not None and not 0.0 < self.anchor_similarity_threshold < 1.0:
            raise ValueError(
                f"anchor_similarity_threshold must be None or in (0, 1), got {self.anchor_similarity_threshold}"
            )
        if self.step_grouping not in STEP_GROUPINGS:
            raise ValueError(f"step_grouping must be one of {list(STEP_GROUPINGS)}, got {self.step_grouping!r}")
        if isinstance(self.hierarchy_depth, bool) or not isinstance(self.hierarchy_depth, int) or self.hierarchy_depth < 0:
            raise ValueError(f"hierarchy_depth must be an int >= 0, got {self.hierarchy_depth!r}")
        if self.step_grouping == "hierarchical" and self.hierarchy_depth > self.history_length:
            warnings.warn(
                f"hierarchy_depth={self.hierarchy_depth} > history_length={self.history_length}: the HGPO levels "
                f"beyond {self.history_length} split rows by history their prompts did not show (HGPO uses "
                "hierarchy_depth <= history_length, e.g. both 2)",
                UserWarning,
                stacklevel=2,
            )
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {self.history_length}")
        if self.invalid_action_penalty < 0:
            raise ValueError(f"invalid_action_penalty must be >= 0, got {self.invalid_action_penalty}")
        if self.num_env_workers < 0:
            raise ValueError(f"num_env_workers must be >= 0, got {self.num_env_workers}")
        if self.env_step_timeout is not None and self.env_step_timeout <= 0:
            raise ValueError(f"env_step_timeout must be None or > 0, got {self.env_step_timeout}")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be None or >= 1, got {self.max_prompt_length}")
        if self.max_dynamic_sampling_rounds < 0:
            raise ValueError(f"max_dynamic_sampling_rounds must be >= 0, got {self.max_dynamic_sampling_rounds}")
        if self.eval_temperature < 0:
            raise ValueError(f"eval_temperature must be >= 0, got {self.eval_temperature}")

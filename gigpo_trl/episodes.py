"""The data of a rollout: one :class:`StepRow` per (episode, turn) (the design's row schema), one
:class:`TrajectoryRecord` per episode, an :class:`Episode`'s state while it runs, and the :class:`RolloutBatch` that
:meth:`~gigpo_trl.rollout.RolloutCollector.collect` returns. Plain dataclasses: no torch, no TRL."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from .conversation import Transcript


@dataclass
class StepRow:
    """One training row: the action taken by one environment at one turn (the design's row schema)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    sampling_logps: list[float] | None
    group_id: Hashable
    trajectory_id: Hashable
    turn: int
    anchor_state: Hashable
    reward: float
    done: bool
    action_valid: bool
    task_type: str | None = None
    completion_text: str = ""
    prompt_messages: list[dict] | None = None
    next_anchor_state: Hashable = None  # anchor of the observation the action returned (GraphGPO's transition)
    observation: Any = None  # the observation the action was taken from (for rollout records)
    action: str | None = None  # the parsed action sent to the environment
    source: str | None = None  # who wrote the completion, where the policy says (Completions.sources)
    # Conversation mode: the turn that started this row's transcript (None in window mode). The rows of a trajectory
    # with one transcript_start form a chain: each row's prompt + completion ids are a prefix of the next one's prompt.
    transcript_start: int | None = None


def advantage_keys(rows: list[StepRow]) -> list[tuple]:
    """What the advantage estimator reads of each row, small and picklable (gathered across ranks):
    ``(group_id, trajectory_id, anchor_state, reward, action_valid, next_anchor_state)`` per row (HGPO's contexts
    are derived from the anchors and the turn order; GraphGPO's graph needs the next anchors)."""
    return [(r.group_id, r.trajectory_id, r.anchor_state, r.reward, r.action_valid, r.next_anchor_state) for r in rows]


@dataclass
class TrajectoryRecord:
    """Summary of one episode: ``episode_return`` = R(τ), the sum of its rewards; ``failed`` when its
    environment broke (``error`` says how); such a trajectory's rows are dropped. ``task_score``: the last
    ``info["task_score"]`` the environment reported (WebShop's purchase score), None when it reports none."""

    trajectory_id: Hashable
    group_id: Hashable
    task: Any
    task_type: str | None
    num_turns: int = 0
    episode_return: float = 0.0
    won: bool = False
    num_invalid: int = 0
    truncated: bool = False
    failed: bool = False
    error: str | None = None
    task_score: float | None = None


@dataclass
class Episode:
    """One episode's state during :meth:`RolloutCollector.collect` (what a policy reads of it).

    ``key``: its environment's name; ``slot``: its index in that environment's pool; ``limit``: its turn limit;
    ``history``: the ``(observation, action)`` pairs of its past turns (the prompt's history window);
    ``observation`` / ``anchor``: the current observation and its anchor state; ``info``: the environment's last
    ``info``; ``instruction`` / ``admissible``: the task's instruction and the current admissible actions (None when
    the environment lists none); ``done``: ended (terminal, truncated or failed); ``transcript``: in conversation
    mode, the chat so far (:class:`~gigpo_trl.conversation.Transcript`, whose ids are the next turn's prompt), else
    None."""

    key: str
    task: Any
    seed: Any
    record: TrajectoryRecord
    limit: int
    slot: int = -1
    history: list[tuple[str, str]] = field(default_factory=list)
    done: bool = False
    observation: Any = None
    anchor: Hashable = None
    info: dict = field(default_factory=dict)
    instruction: str = ""
    admissible: list[str] | None = None
    transcript: Transcript | None = None


@dataclass
class RolloutBatch:
    """What :meth:`RolloutCollector.collect` returns (``prefill_tokens`` / ``prefill_tokens_saved``: the policy's
    :class:`~gigpo_trl.policy.Completions` counts, summed over the turns)."""

    rows: list[StepRow] = field(default_factory=list)
    trajectories: list[TrajectoryRecord] = field(default_factory=list)
    num_generate_calls: int = 0
    max_prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefill_tokens_saved: int = 0

    def extend(self, other: RolloutBatch) -> None:
        """Append ``other``'s rows and trajectories (its generate calls and prefill tokens counted, its longest
        prompt kept)."""
        self.rows += other.rows
        self.trajectories += other.trajectories
        self.num_generate_calls += other.num_generate_calls
        self.prefill_tokens += other.prefill_tokens
        self.prefill_tokens_saved += other.prefill_tokens_saved
        self.max_prompt_tokens = max(self.max_prompt_tokens, other.max_prompt_tokens)


__all__ = ["Episode", "RolloutBatch", "StepRow", "TrajectoryRecord", "advantage_keys"]

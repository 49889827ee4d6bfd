"""Multi-turn rollout collector: one training row per (environment, turn).

Per turn (GiGPO Sec. 3 / Alg. 1, "rollout" phase):

1. build one chat prompt per active environment (instruction, last ``history_length`` observation/action
   pairs, current observation, admissible actions) — :mod:`gigpo_trl.prompts`;
2. generate for all active environments in ONE batched call (``generate_fn``, in the trainer TRL's own
   ``_generate_single_turn``, so transformers, vLLM colocate and vLLM server all work);
3. parse ``<think>…</think><action>…</action>`` (or the env's ``parse_completion``) — :mod:`gigpo_trl.parsing`;
4. step the environments through an :class:`~gigpo_trl.envs.pool.EnvPool`.

A trajectory ends at ``done``, at ``max_turns`` (truncation, treated as terminal by the advantage), or when
its environment fails (raises, times out, returns a bad value) or its prompt cannot fit ``max_prompt_length`` even
without history: a failed trajectory is recorded with its
error and contributes no training rows, so its group's statistics are computed over the healthy members.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .envs.base import episode_success, success_threshold
from .envs.checker import anchor_warnings, check_anchor
from .envs.pool import EnvPool
from .observers import RolloutContext, RolloutObserver, notify
from .parsing import parse_for_env
from .prompts import build_messages

logger = logging.getLogger(__name__)


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
class RolloutBatch:
    """What :meth:`RolloutCollector.collect` returns."""

    rows: list[StepRow] = field(default_factory=list)
    trajectories: list[TrajectoryRecord] = field(default_factory=list)
    num_generate_calls: int = 0
    max_prompt_tokens: int = 0

    def extend(self, other: RolloutBatch) -> None:
        """Append ``other``'s rows and trajectories (its generate calls counted, its longest prompt kept)."""
        self.rows += other.rows
        self.trajectories += other.trajectories
        self.num_generate_calls += other.num_generate_calls
        self.max_prompt_tokens = max(self.max_prompt_tokens, other.max_prompt_tokens)


class RolloutCollector:
    """Collects multi-turn rollouts for a batch of tasks.

    Args:
        env_factories: ``{name: factory}``; a task row's ``env`` column picks one (default: the only one).
        generate_fn: ``generate_fn(prompt_ids: list[list[int]]) -> (completion_ids, logprobs or None)``, one
            batched call per turn.
        tokenize_fn: ``tokenize_fn(messages: list[list[dict]]) -> list[list[int]]``: chat prompts to token ids
            (chat template applied, generation prompt added).
        decode_fn: ``decode_fn(completion_ids: list[list[int]]) -> list[str]``.
        max_turns: turn limit T (an env's own ``max_turns`` wins when smaller).
        history_length: k, the number of past observation/action pairs shown in each prompt.
        max_prompt_length: token limit of a prompt; history is dropped (oldest first) to fit; a prompt that still
            does not fit fails its trajectory (``ValueError`` from :meth:`check_task` at init). ``None``: no limit.
        sync_fn: multi-process agreement ``sync_fn(local_count) -> global_max``; every rank then generates
            ``global_max`` prompts (filler prompts, whose outputs are dropped, pad the local list) so all ranks
            make the same number of generate calls of the same size. ``None``: single process.
        num_env_workers / step_timeout / env_backend / ray_address: passed to each :class:`EnvPool` (as
            ``num_workers``, ``step_timeout``, ``backend``, ``ray_address``).
        progress: show a per-turn tqdm bar.
        require_think: mark completions without ``<think>`` invalid.
        templates: ``{name: env instance}`` already built by the caller, used as that env's probe instance.
        success_threshold: the last-turn reward at or above which an episode whose ``info`` reports no
            ``"won"``/``"success"`` succeeded; ``None``: each env's ``max_reward``, else 1.0
            (:func:`~gigpo_trl.envs.base.episode_success`).
        observers: :class:`~gigpo_trl.observers.RolloutObserver` s told of each batch :meth:`collect` returns
            (``on_rollout``); the list is :attr:`observers`, shared with the trainer's.
    """

    def __init__(
        self,
        env_factories: Mapping[str, Callable[[], Any]],
        generate_fn: Callable,
        tokenize_fn: Callable,
        decode_fn: Callable,
        max_turns: int,
        history_length: int = 2,
        max_prompt_length: int | None = None,
        sync_fn: Callable[[int], int] | None = None,
        num_env_workers: int = 0,
        step_timeout: float | None = None,
        env_backend: str = "process",
        ray_address: str | None = None,
        progress: bool = False,
        require_think: bool = True,
        templates: Mapping[str, Any] | None = None,
        observers: list[RolloutObserver] | None = None,
        success_threshold: float | None = None,
    ):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        # A factory that must know the turn limit (a TRL env calls get_reward() at truncation) gets it here.
        self.env_factories = {name: f.with_turn_limit(max_turns) if hasattr(f, "with_turn_limit") and not
                              isinstance(f, type) else f for name, f in env_factories.items()}
        self._anchors_checked = False
        self.generate_fn = generate_fn
        self.tokenize_fn = tokenize_fn
        self.decode_fn = decode_fn
        self.max_turns = max_turns
        self.history_length = history_length
        self.max_prompt_length = max_prompt_length
        self.sync_fn = sync_fn
        self.progress = progress
        self.require_think = require_think
        self.success_threshold = success_threshold
        self._thresholds: dict[str, float] = {}  # per env, from its probe instance at first use
        self.observers = observers if observers is not None else []
        self._pool_kwargs = {"num_workers": num_env_workers, "step_timeout": step_timeout, "backend": env_backend,
                             "ray_address": ray_address}
        self.pools = {name: EnvPool(factory, **self._pool_kwargs) for name, factory in self.env_factories.items()}
        # One probe instance per env for prompt templates / limits (reusing any the caller already built); the
        # pools own the stepping instances.
        templates = dict(templates or {})
        self._templates = {name: templates.get(name) or factory() for name, factory in self.env_factories.items()}

    def close_pools(self) -> None:
        """Stop the env pools (their worker processes); the next :meth:`collect` starts fresh ones."""
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()

    @contextlib.contextmanager
    def pools_closed_on_error(self):
        """Close the env pools when the block raises (a worker may be mid-call); the next collect starts fresh ones."""
        try:
            yield
        except BaseException:
            self.close_pools()
            raise

    def _pool(self, key: str) -> EnvPool:
        if key not in self.pools:
            self.pools[key] = EnvPool(self.env_factories[key], **self._pool_kwargs)
        return self.pools[key]

    def close(self) -> None:
        self.close_pools()
        for env in self._templates.values():
            if hasattr(env, "close"):
                env.close()

    # ------------------------------------------------------------------ helpers
    def _env_key(self, task_row: Mapping) -> str:
        if len(self.env_factories) == 1:
            return next(iter(self.env_factories))
        key = task_row.get("env")
        if key not in self.env_factories:
            raise ValueError(f"task row has env={key!r}; expected one of {sorted(self.env_factories)}")
        return key

    def _reset_task(self, key: str, row: Mapping) -> Any:
        """What ``reset`` gets as ``task``: the row's ``task``, or the whole row (env with ``reset_receives_row``)."""
        return dict(row) if getattr(self._templates[key], "reset_receives_row", False) else row["task"]

    def _threshold(self, key: str) -> float:
        if key not in self._thresholds:
            self._thresholds[key] = success_threshold(self._templates[key], self.success_threshold)
        return self._thresholds[key]

    def _turn_limit(self, key: str) -> int:
        env_limit = getattr(self._templates[key], "max_turns", None)
        return min(self.max_turns, env_limit) if env_limit else self.max_turns

    def _messages(self, st: dict, turn: int, keep: int) -> list[dict]:
        history = st["history"][len(st["history"]) - keep:] if keep else []
        env = self._templates[st["key"]]
        return build_messages(env, st["instruction"], st["observation"], history, turn, st["limit"], st["admissible"])

    def _prompts(self, states: list[dict], turn: int) -> list[tuple[list[dict], list[int] | None, str | None]]:
        """``(messages, token ids, None)`` of each env's prompt, tokenized in one batched call; a prompt over the
        token limit is rebuilt with a shorter history window (oldest pairs dropped first). A prompt that does not
        fit even with no history is ``(messages, None, why)``: the caller decides (error at init, failed
        trajectory in the turn loop), so nothing here raises for one trajectory."""
        keeps = [min(self.history_length, len(st["history"])) for st in states]
        messages = [self._messages(st, turn, keep) for st, keep in zip(states, keeps)]
        ids = self._tokenize_distinct(messages)
        out = []
        for st, keep, msgs, tokens in zip(states, keeps, messages, ids):
            error = None
            while self.max_prompt_length is not None and len(tokens) > self.max_prompt_length:
                if keep == 0:
                    error = (
                        f"prompt of task {st['task']!r} at turn {turn} has {len(tokens)} tokens, more than "
                        f"max_prompt_length={self.max_prompt_length} even with no history; raise max_prompt_length "
                        "(within the model's context) or shorten the environment's observations"
                    )
                    tokens = None
                    break
                keep -= 1
                msgs = self._messages(st, turn, keep)
                tokens = self.tokenize_fn([msgs])[0]
            out.append((msgs, tokens, error))
        return out

    def _tokenize_distinct(self, messages: list[list[dict]]) -> list[list[int]]:
        """``tokenize_fn`` over the distinct prompts only, in one call: group members in the same state with the
        same history share a prompt (all N of a group at turn 0). Prompts with non-text content are all sent."""
        if not messages:
            return []
        try:
            keys = [tuple((m["role"], m["content"]) for m in msgs) for msgs in messages]
            first: dict = {}
            for i, key in enumerate(keys):
                first.setdefault(key, i)
        except TypeError:  # unhashable (multimodal) content
            return self.tokenize_fn(messages)
        unique = list(first.values())
        ids = self.tokenize_fn([messages[i] for i in unique])
        by_key = {keys[i]: tokens for i, tokens in zip(unique, ids)}
        return [list(by_key[key]) for key in keys]

    def check_task(self, task_row: Mapping, key: str | None = None) -> list[int]:
        """Reset env ``key`` once on ``task_row`` and build its first prompt; returns the prompt's token ids.

        One ``reset`` and no ``step`` (``check_env`` would cost several env calls, ~1 s each for ALFWorld), on the
        probe instance that only serves prompt attributes.

        Raises:
            RuntimeError: the env's ``reset`` raised (the original error is chained).
            TypeError: ``reset`` did not return ``(observation, info: dict)``, or returned a non-``str``
                observation without an ``anchor_state`` hook, or an unhashable anchor.
            ValueError: the first prompt cannot fit ``max_prompt_length``.
        """
        key = key or self._env_key(task_row)
        env = self._templates[key]
        task, seed = task_row["task"], task_row.get("seed")
        where = f"{type(env).__name__} (env {key!r}) on the first training task {task!r}, seed {seed!r}"
        try:
            out = env.reset(self._reset_task(key, task_row), seed)
        except Exception as exc:
            raise RuntimeError(f"init check: reset of {where} raised {type(exc).__name__}: {exc}") from exc
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise TypeError(f"init check: reset of {where} must return (observation, info: dict), got {out!r:.200}")
        observation, info = out
        try:
            check_anchor(env, observation, "reset")
        except TypeError as exc:
            raise TypeError(f"init check on the first training task {task!r}: {exc}") from None
        state = {"key": key, "task": task, "instruction": info.get("instruction", ""), "observation": observation,
                 "history": [], "limit": self._turn_limit(key), "admissible": info.get("admissible_actions")}
        _, tokens, error = self._prompts([state], 0)[0]
        if error is not None:
            raise ValueError(error)
        return tokens

    # ------------------------------------------------------------------ main loop
    def collect(
        self, tasks: Sequence[Mapping], group_ids: Sequence[Hashable], trajectory_prefix: Hashable = 0,
        context: RolloutContext | None = None,
    ) -> RolloutBatch:
        """Run one episode per task row (rows of one group are copies of the same task and seed).

        Args:
            tasks: task rows with ``task`` and optionally ``seed``, ``task_type``, ``env``.
            group_ids: the task group of each row (same length as ``tasks``).
            trajectory_prefix: makes trajectory ids unique across ranks: id = ``(prefix, index)``.
            context: what the rollout is for, passed to the observers' ``on_rollout`` (default: a training rollout
                on rank 0).

        Returns:
            RolloutBatch with the rows in (turn, environment) order.

        Raises:
            ValueError: ``tasks`` and ``group_ids`` differ in length, or a row lacks ``task``. A prompt that cannot
                fit ``max_prompt_length`` even with no history fails its trajectory (logged with its task), like an
                environment error; it never raises inside the turn loop.
        """
        if len(tasks) != len(group_ids):
            raise ValueError(f"tasks ({len(tasks)}) and group_ids ({len(group_ids)}) differ in length")
        batch = RolloutBatch()
        states = self._start_episodes(tasks, group_ids, trajectory_prefix, batch)
        filler: list[int] | None = None  # a prompt that filler rows repeat (the first real prompt of the batch)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.max_turns, desc="rollout turns", leave=False)
        for turn in range(self.max_turns):
            active, prompts = self._turn_prompts(states, turn)
            prompt_ids = [ids for _, ids, _ in prompts]
            if prompt_ids and filler is None:
                filler = prompt_ids[0]
            n_global = self.sync_fn(len(active)) if self.sync_fn is not None else len(active)
            if n_global == 0:
                break
            completion_ids, logprobs, texts = self._generate_completions(prompt_ids, len(active), n_global, filler,
                                                                         batch)
            pending, actions = self._parse_actions(states, active, prompts, completion_ids, logprobs, texts, batch)
            self._step_envs(states, active, pending, actions, turn, batch)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        batch = self._close_trajectories(batch)
        notify(self.observers, "on_rollout", batch, context if context is not None else RolloutContext())
        return batch

    def _start_episodes(self, tasks, group_ids, trajectory_prefix, batch: RolloutBatch) -> list[dict]:
        """One state dict and :class:`TrajectoryRecord` per task row, and every environment reset (one batched call
        per pool; slot j of pool ``key`` runs the j-th row routed to it). A failed reset fails its trajectory."""
        states: list[dict] = []
        by_key: dict[str, list[int]] = {}
        for i, row in enumerate(tasks):
            if "task" not in row:
                raise ValueError(f"task row {i} has no 'task' column (columns: {sorted(row)})")
            key = self._env_key(row)
            by_key.setdefault(key, []).append(i)
            record = TrajectoryRecord((trajectory_prefix, i), group_ids[i], row["task"], row.get("task_type"))
            batch.trajectories.append(record)
            states.append({"key": key, "task": row["task"], "seed": row.get("seed"), "record": record,
                           "history": [], "done": False, "limit": self._turn_limit(key)})
        for key, idxs in by_key.items():
            results = self._pool(key).reset([self._reset_task(key, tasks[i]) for i in idxs],
                                            [states[i]["seed"] for i in idxs])
            for slot, (i, res) in enumerate(zip(idxs, results)):
                st = states[i]
                st["slot"] = slot
                if res.error is not None:
                    self._fail(st, res.error)
                    continue
                st["observation"], st["anchor"] = res.observation, res.anchor
                st["info"] = res.info  # the last info, for a collector that acts on it (the expert warm-up)
                st["instruction"] = res.info.get("instruction", "")
                st["admissible"] = res.info.get("admissible_actions")
                if st["record"].task_type is None and res.info.get("task_type") is not None:
                    st["record"].task_type = res.info["task_type"]
        return states

    def _turn_prompts(self, states: list[dict], turn: int) -> tuple[list[int], list[tuple]]:
        """``(active state indices, [(messages, prompt token ids, None)])`` of this turn's live episodes.

        A prompt that cannot fit ends its own trajectory as failed (before the per-turn collective, so every rank
        still makes the same calls); cutting the observation instead would hide part of the state."""
        active = [i for i, st in enumerate(states) if not st["done"]]
        prompts = self._prompts([states[i] for i in active], turn)
        for i, (_, _, error) in zip(active, prompts):
            if error is not None:
                self._fail(states[i], error)
        return [i for i in active if not states[i]["done"]], [p for p in prompts if p[2] is None]

    def _generate_completions(self, prompt_ids, n_active: int, n_global: int, filler, batch: RolloutBatch):
        """One batched generate call of ``n_global`` prompts (the ranks' largest count): this rank's prompts, then
        filler prompts, which keep every rank's generate calls equal in number and size (collectives inside).
        Returns ``(completion ids, sampling log-probs or None, decoded texts)`` of this rank's ``n_active`` rows."""
        padded = prompt_ids + [filler or [0]] * (n_global - len(prompt_ids))
        completion_ids, logprobs = self.generate_fn(padded)
        batch.num_generate_calls += 1
        completion_ids = [list(c) for c in completion_ids[:n_active]]
        texts = self.decode_fn(completion_ids) if n_active else []
        return completion_ids, logprobs, texts

    def _parse_actions(self, states, active, prompts, completion_ids, logprobs, texts, batch: RolloutBatch):
        """Each completion's action (:func:`parse_for_env`): the env's own ``parse_completion`` if it has one (tool
        calls, the paper's projection), else ``<think>/<action>`` parsing where an unparsable completion gets the
        env's ``invalid_action`` or the text's tail, as the GiGPO reference does. Returns ``(pending, actions)``: per state index its turn's
        ``(messages, prompt ids, completion ids, log-probs, text, parsed)``, and per pool ``{slot: action}``."""
        actions: dict[str, dict[int, str]] = {}
        pending = {}
        for n, i in enumerate(active):
            st = states[i]
            parsed = parse_for_env(self._templates[st["key"]], texts[n], require_think=self.require_think)
            prompt_ids = prompts[n][1]
            batch.max_prompt_tokens = max(batch.max_prompt_tokens, len(prompt_ids))
            pending[i] = (prompts[n][0], prompt_ids, completion_ids[n],
                          logprobs[n] if logprobs is not None else None, texts[n], parsed)
            actions.setdefault(st["key"], {})[st["slot"]] = parsed.action
        return pending, actions

    def _step_envs(self, states, active, pending, actions, turn: int, batch: RolloutBatch) -> None:
        """Step every pool once with its slots' actions, record one :class:`StepRow` per live episode and advance
        its state (history, observation, anchor); an episode ends on the env's ``done`` or its turn limit (then
        truncated). An env error fails the trajectory."""
        results = {}
        for key, slot_actions in actions.items():
            for slot, res in self._pool(key).step(slot_actions).items():
                results[(key, slot)] = res
        for i in active:
            st = states[i]
            messages, p_ids, c_ids, logps, text, parsed = pending[i]
            res = results[(st["key"], st["slot"])]
            record = st["record"]
            if res.error is not None:
                self._fail(st, res.error)
                continue
            valid = parsed.valid and res.info.get("action_valid", True) is not False
            done = bool(res.done) or turn + 1 >= st["limit"]
            batch.rows.append(StepRow(
                prompt_ids=p_ids, completion_ids=c_ids, sampling_logps=logps, group_id=record.group_id,
                trajectory_id=record.trajectory_id, turn=turn, anchor_state=st["anchor"],
                reward=float(res.reward), done=done, action_valid=valid, task_type=record.task_type,
                completion_text=text, prompt_messages=messages, next_anchor_state=res.anchor,
                observation=st["observation"], action=parsed.action,
            ))
            record.num_turns += 1
            record.episode_return += float(res.reward)
            record.num_invalid += int(not valid)
            if "task_score" in res.info:
                record.task_score = float(res.info["task_score"])
            st["history"].append((str(st["observation"]), parsed.history_action))
            st["observation"], st["anchor"] = res.observation, res.anchor
            st["admissible"] = res.info.get("admissible_actions", st["admissible"])
            st["info"] = res.info
            if done:
                st["done"] = True
                record.won = res.done and episode_success(res.info, res.reward, self._threshold(st["key"]))
                record.truncated = not res.done

    def _close_trajectories(self, batch: RolloutBatch) -> RolloutBatch:
        """Drop the rows of failed trajectories: their returns are not samples of the task. On the first batch with
        rows, warn about anchors that never repeat or transcript-like observations (:func:`anchor_warnings`)."""
        failed = {r.trajectory_id for r in batch.trajectories if r.failed}
        if failed:
            batch.rows = [row for row in batch.rows if row.trajectory_id not in failed]
        if not self._anchors_checked and batch.rows:  # once: anchors that never repeat, transcript observations
            self._anchors_checked = True
            for message in anchor_warnings(batch.rows):
                warnings.warn(message, UserWarning, stacklevel=3)
        return batch

    @staticmethod
    def _fail(st: dict, error: str) -> None:
        st["done"] = True
        st["record"].failed = True
        st["record"].error = error
        logger.warning("trajectory %s (task %r) failed: %s", st["record"].trajectory_id, st["task"], error)

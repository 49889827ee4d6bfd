"""What every worker backend of :class:`~gigpo_trl.envs.pool.EnvPool` shares: the per-slot result, the runner that
holds some slots' environments and turns their failures into results, the encoding of results for the trip back to the
trainer, and the :class:`WorkerBackend` interface."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base import EpisodeFault, env_anchor, env_name
from ..checker import check_anchor, validate_reward

STARTUP_TIMEOUT = 300.0  # seconds a new worker may take to import modules and unpickle the factory
RESTARTED = "worker restarted"


@dataclass
class EnvResult:
    """Outcome of one ``reset`` or ``step`` of one slot.

    Attributes:
        observation: what the env returned (``None`` on error).
        reward (`float`): validated finite reward (0.0 for ``reset`` and on error).
        done (`bool`): episode over; always ``True`` when ``error`` is set.
        info (`dict`): the env's info dict.
        anchor (`Hashable`): ``env_anchor(env, observation)``, computed where the env lives.
        error (`str` or `None`): why the slot failed (env raised, timed out, bad return value, worker died).
    """

    observation: Any = None
    reward: float = 0.0
    done: bool = False
    info: dict = field(default_factory=dict)
    anchor: Hashable = None
    error: str | None = None


def task_label(task: Any) -> str:
    """``repr(task)``, cut to 120 characters, for error messages."""
    text = repr(task)
    return text if len(text) <= 120 else text[:117] + "..."


def error_result(message: str) -> EnvResult:
    """A failed slot's result: ``done`` with ``error`` set."""
    return EnvResult(observation=None, reward=0.0, done=True, info={}, anchor=None, error=message)


class SlotRunner:
    """Holds the env instances of some slots and runs reset/step on them, turning failures into results.

    Used directly by the in-process backend and inside every worker process / Ray actor.
    """

    def __init__(self, env_factory: Callable[[], Any], progress: Any = None):
        self.env_factory = env_factory
        self.progress = progress  # shared [item index, start time] array read by the parent for timeouts
        self.envs: dict[int, Any] = {}
        self.tasks: dict[int, Any] = {}
        self.active: set[int] = set()
        self.num_created = 0

    def run(self, kind: str, items: Sequence[tuple]) -> list[tuple[int, EnvResult]]:
        out = []
        for index, item in enumerate(items):
            if self.progress is not None:
                self.progress[1] = time.monotonic()
                self.progress[0] = index
            result = self.reset(*item) if kind == "reset" else self.step(*item)
            out.append((item[0], result))
        if self.progress is not None:
            self.progress[0] = -1
        return out

    def reset(self, slot: int, task: Any, seed: int | None) -> EnvResult:
        self.tasks[slot] = task
        self.active.discard(slot)
        where = f"slot {slot}, task {task_label(task)}"
        try:
            env = self.envs.get(slot)
            if env is None:
                env = self.env_factory()
                self.num_created += 1
                self.envs[slot] = env
            out = env.reset(task, seed)
        except Exception as exc:  # noqa: BLE001 - any env failure becomes an error result
            self._discard(slot)
            return error_result(f"{where}: {_raised('reset', exc)}")
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            self._discard(slot)
            return error_result(f"{where}: reset must return (observation, info: dict), got {out!r:.200}")
        obs, info = out
        anchor, error = _anchor_of(env, obs, "reset")
        if error is not None:
            return error_result(f"{where}: {error}")
        self.active.add(slot)
        return EnvResult(observation=obs, reward=0.0, done=False, info=info, anchor=anchor)

    def step(self, slot: int, action: str) -> EnvResult:
        task = self.tasks.get(slot)
        where = f"slot {slot}, task {task_label(task)}"
        env = self.envs.get(slot)
        if env is None or slot not in self.active:
            return error_result(f"{where}: no active episode in this slot; call reset first")
        try:
            out = env.step(action)
        except Exception as exc:  # noqa: BLE001
            self._discard(slot)
            return error_result(f"{where}: {_raised(f'step({action!r:.100})', exc)}")
        if not (isinstance(out, tuple) and len(out) == 4 and isinstance(out[3], dict)):
            self.active.discard(slot)
            return error_result(
                f"{where}: step must return (observation, reward, done, info: dict), got {out!r:.200}"
            )
        obs, reward, done, info = out
        try:
            reward = validate_reward(reward, f"{type(env).__name__}.step")
        except (TypeError, ValueError) as exc:
            self.active.discard(slot)
            return error_result(f"{where}: {exc}")
        anchor, error = _anchor_of(env, obs, "step")
        if error is not None:
            self.active.discard(slot)
            return error_result(f"{where}: {error}")
        return EnvResult(observation=obs, reward=reward, done=bool(done), info=info, anchor=anchor)

    def close(self) -> None:
        for slot in list(self.envs):
            self._discard(slot)

    def _discard(self, slot: int) -> None:
        """Drop a slot's env (after it raised, its state is unknown); the next reset builds a fresh one."""
        self.active.discard(slot)
        env = self.envs.pop(slot, None)
        if env is not None and hasattr(env, "close"):
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass


def _anchor_of(env: Any, obs: Any, method: str) -> tuple[Hashable, str | None]:
    """``(env_anchor(env, obs), None)``, or ``(None, message)`` when the observation/anchor is unusable."""
    try:
        check_anchor(env, obs, method)
        return env_anchor(env, obs), None
    except Exception as exc:  # noqa: BLE001 - TypeError from the check, anything from a user hook
        return None, f"{type(exc).__name__}: {exc}"


def _raised(call: str, exc: Exception) -> str:
    """Why an env call failed: ``"<call> raised <type>: <text>"``, or an :class:`EpisodeFault`'s own message."""
    return str(exc) if isinstance(exc, EpisodeFault) else f"{call} raised {type(exc).__name__}: {exc}"


def encode_results(runner: SlotRunner, results: list[tuple[int, EnvResult]]) -> list[tuple[int, str, bytes]]:
    """``[(slot, env class name, pickled EnvResult)]``: each result pickled on its own and read back here, so a value
    the trainer could not read (an exception in ``info`` whose class needs other constructor arguments pickles fine
    and fails in ``pickle.loads``) fails its own slot with a message naming the env, not the whole reply."""
    out = []
    for slot, result in results:
        env = runner.envs.get(slot)
        name = env_name(env) if env is not None else "env"
        try:
            payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - anything pickle raises for any user value
            where = f"slot {slot}, task {task_label(runner.tasks.get(slot))}"
            runner.active.discard(slot)
            payload = pickle.dumps(error_result(
                f"{where}: {name} returned a value the worker cannot send to the trainer ({_unsendable_part(result)}: "
                f"{type(exc).__name__}: {exc}); observation, info values and anchor must survive pickle.dumps and "
                "pickle.loads (store str(exc), not an exception whose __init__ takes other arguments than its message)"
            ))
        out.append((slot, name, payload))
    return out


def _unsendable_part(result: EnvResult) -> str:
    """Which part of ``result`` does not survive pickling: ``info['key']``, ``observation``, ``anchor`` or ``result``."""
    parts = [(f"info[{key!r}]", value) for key, value in result.info.items()] if isinstance(result.info, dict) else []
    for label, value in [("observation", result.observation), ("anchor", result.anchor), *parts]:
        try:
            pickle.loads(pickle.dumps(value))
        except Exception:  # noqa: BLE001
            return label
    return "result"


def decode_results(replies: list[tuple[int, str, bytes]], slot_tasks: Sequence[Any]) -> dict[int, EnvResult]:
    """The worker's encoded results (see :func:`_encode_results`); one the trainer cannot unpickle (a class missing
    here, say) fails its own slot."""
    results = {}
    for slot, name, payload in replies:
        try:
            results[slot] = pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001
            task = slot_tasks[slot] if slot < len(slot_tasks) else None
            results[slot] = error_result(
                f"slot {slot}, task {task_label(task)}: the trainer cannot read what {name} returned in the worker "
                f"({type(exc).__name__}: {exc}); observation, info values and anchor must unpickle in the trainer "
                "(classes importable there)"
            )
    return results


def split_by_worker(items: list[tuple], num_workers: int) -> dict[int, list[tuple]]:
    """``{worker index: its items}``: slot ``i`` (each item's first field) lives in worker ``i % num_workers``."""
    per_worker: dict[int, list[tuple]] = {}
    for item in items:
        per_worker.setdefault(item[0] % num_workers, []).append(item)
    return per_worker


class WorkerBackend:
    """Where the slots' environments live and run: one class per backend (:class:`~.in_process.InProcessBackend`,
    :class:`~.processes.ProcessBackend`, :class:`~.ray_actors.RayBackend`); :class:`~gigpo_trl.envs.pool.EnvPool`
    keeps the slots' tasks and lost episodes and talks to its backend through these methods only.

    Slot ``i`` lives in worker ``i % num_workers`` (``num_workers`` 0: all in this process).
    """

    num_workers: int = 0
    handles: list = []  # the backend's worker handles (processes, actors), for monitoring and tests

    def run(self, kind: str, items: list[tuple],
            slot_tasks: Sequence[Any]) -> tuple[dict[int, EnvResult], list[int]]:
        """Run ``kind`` (``"reset"``: items ``(slot, task, seed)``; ``"step"``: items ``(slot, action)``) on the
        items' slots; returns ``(result per slot, indices of the workers restarted)``. Every slot of a restarted worker
        has lost its episode; the failing ones have an error result already. ``slot_tasks``: each slot's task, for
        error messages."""
        raise NotImplementedError

    def num_envs_created(self) -> int:
        """How many env instances the factory has built so far (all workers together)."""
        raise NotImplementedError

    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers, where the backend knows them."""
        return [getattr(h, "pid", None) for h in self.handles]

    def close(self) -> None:
        """Close all environments and stop the workers."""
        raise NotImplementedError

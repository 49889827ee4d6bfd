""":class:`EnvPool`: the slots' tasks and episodes, in front of one worker backend (:mod:`.in_process`,
:mod:`.processes` or :mod:`.ray_actors`)."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import RESTARTED, EnvResult, WorkerBackend, error_result, task_label
from .in_process import InProcessBackend

logger = logging.getLogger(__name__)

_ABANDONED = "an earlier call on this slot raised before its results came back"
BACKENDS = ("process", "ray")  # where the workers run (num_workers >= 1); GiGPOConfig.env_backend takes these


class EnvPool:
    """A pool of environment instances, one per slot.

    Args:
        env_factory (`Callable[[], Any]`): builds one environment (a ``TextEnv`` or any object with
            ``reset``/``step``). Must be picklable when ``num_workers > 0``.
        num_workers (`int`, defaults to 0): 0 steps all envs in this process; ``n >= 1`` runs them in ``n``
            worker processes (or Ray actors), slot ``i`` in worker ``i % n``.
        step_timeout (`float`, *optional*): seconds one env ``reset``/``step`` may take before its worker is
            killed and restarted (workers only).
        backend (`str`, defaults to `"process"`): ``"process"`` (worker processes on this machine) or ``"ray"``
            (Ray actors, on a cluster if Ray is connected to one; see the module docstring).
        ray_address (`str`, *optional*): ``ray.init(address=...)`` when ``backend="ray"`` and Ray is not yet
            initialised in this process (``"auto"``, ``"host:port"``, ``"ray://host:10001"``); ``None``: Ray's own
            lookup (``RAY_ADDRESS``, else a local instance). Ignored when Ray is already initialised.

    Raises:
        TypeError: ``env_factory`` is not callable, or cannot be pickled when ``num_workers > 0``.
        ValueError: a negative ``num_workers``, an unknown ``backend``, ``step_timeout <= 0``, or ``ray_address``
            with ``backend="process"``.
        ImportError: ``backend="ray"`` without the ``ray`` package.

    Example::

        from gigpo_trl.envs.frozenlake import FrozenLakeEnv

        with EnvPool(FrozenLakeEnv, num_workers=2, step_timeout=30) as pool:
            first = pool.reset([0, 0, 1, 1], [0, 0, 1, 1])
            results = pool.step({0: "down", 2: "right"})
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        num_workers: int = 0,
        step_timeout: float | None = None,
        backend: str = "process",
        ray_address: str | None = None,
    ):
        if not callable(env_factory):
            raise TypeError(
                f"env_factory must be callable (an env class or a zero-argument function), got {env_factory!r}"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be 'process' or 'ray', got {backend!r}")
        if ray_address is not None and backend != "ray":
            raise ValueError(f"ray_address={ray_address!r} needs backend='ray', got backend={backend!r}")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 or None, got {step_timeout}")
        self.env_factory = env_factory
        self.num_workers = int(num_workers)
        self.step_timeout = step_timeout
        self.backend = backend
        self._closed = False
        self._slot_tasks: list[Any] = []
        self._slot_lost: list[str | None] = []  # why the slot's episode state is lost (worker restart, abandoned call)
        self.workers: WorkerBackend  # where the slots' environments live: one class per backend
        if backend == "ray":
            try:
                import ray  # noqa: F401
            except ImportError:
                raise ImportError(
                    "EnvPool(backend='ray') needs the optional Ray dependency: pip install gigpo_trl[ray]"
                ) from None
        if self.num_workers == 0:
            if step_timeout is not None:
                logger.info("EnvPool: step_timeout is not enforced with num_workers=0 (in-process envs)")
            self.workers = InProcessBackend(env_factory)
            return
        try:
            pickle.dumps(env_factory)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(
                f"env_factory {env_factory!r} cannot be pickled ({type(exc).__name__}: {exc}); with num_workers > 0 "
                "pass the env class itself, a module-level function or a functools.partial, not a lambda or a "
                "local function"
            ) from None
        if backend == "ray":
            from .ray_actors import RayBackend

            self.workers = RayBackend(env_factory, self.num_workers, step_timeout, ray_address)
        else:
            from .processes import ProcessBackend

            self.workers = ProcessBackend(env_factory, self.num_workers, step_timeout)

    # ------------------------------------------------------------------ public API
    @property
    def num_slots(self) -> int:
        return len(self._slot_tasks)

    def lane(self, slot: int) -> int:
        """Where ``slot``'s environment runs: its worker (``slot % num_workers``), or, in process, the slot itself.
        :meth:`step` calls on slots of different lanes may run at the same time from different threads; calls on
        one lane must not overlap (a worker answers one message at a time; an environment takes one call at a
        time)."""
        return slot % self.num_workers if self.num_workers else slot

    def reset(self, tasks: Sequence[Any], seeds: Sequence[int | None]) -> list[EnvResult]:
        """Start ``len(tasks)`` episodes; slot ``i`` gets ``tasks[i]``, ``seeds[i]``. Returns one result per slot."""
        self._check_open()
        tasks, seeds = list(tasks), list(seeds)
        if len(tasks) != len(seeds):
            raise ValueError(f"reset got {len(tasks)} tasks but {len(seeds)} seeds")
        while len(self._slot_tasks) < len(tasks):
            self._slot_tasks.append(None)
            self._slot_lost.append(None)
        for slot, task in enumerate(tasks):
            self._slot_tasks[slot] = task
            self._slot_lost[slot] = None
        items = [(slot, task, seed) for slot, (task, seed) in enumerate(zip(tasks, seeds))]
        results = self._run("reset", items)
        return [results[slot] for slot in range(len(tasks))]

    def step(self, actions: Mapping[int, str]) -> dict[int, EnvResult]:
        """Step the slots named in ``actions`` (in parallel across workers); other slots are untouched."""
        self._check_open()
        results: dict[int, EnvResult] = {}
        items = []
        for slot, action in actions.items():
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"step got slot {slot}, but the pool has {self.num_slots} slots (reset first)")
            if self._slot_lost[slot]:
                where = f"slot {slot}, task {task_label(self._slot_tasks[slot])}"
                results[slot] = error_result(
                    f"{where}: {self._slot_lost[slot]}; the episode was lost (reset the slot to start a new one)"
                )
                logger.warning("EnvPool: %s", results[slot].error)
            else:
                items.append((slot, action))
        results.update(self._run("step", items))
        return {slot: results[slot] for slot in actions}

    def close(self) -> None:
        """Close all envs and stop the workers; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "workers"):  # (an __init__ that raised built none)
            self.workers.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers (process backend), for monitoring and tests."""
        return self.workers.worker_pids()

    def num_envs_created(self) -> int:
        """How many env instances ``env_factory`` has built so far (all workers together)."""
        return self.workers.num_envs_created()

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnvPool is closed")

    def _run(self, kind: str, items: list[tuple]) -> dict[int, EnvResult]:
        if not items:
            return {}
        try:
            results, restarted = self.workers.run(kind, items, self._slot_tasks)
        except BaseException:
            # Interrupted (Ctrl-C, a bug): the envs may have run, the caller saw nothing; the slots' episodes are
            # lost until reset. A late reply is told apart by its request id.
            for item in items:
                self._slot_lost[item[0]] = _ABANDONED
            raise
        for index in restarted:  # a restarted worker's slots lost their episodes (fresh env instances)
            for slot in range(index, self.num_slots, self.num_workers):
                self._slot_lost[slot] = RESTARTED
        for result in results.values():
            if result.error is not None:
                logger.warning("EnvPool: %s", result.error)
        return results

"""The Ray backend: one Ray actor per worker instead of a process, each reserving one CPU wherever the cluster places
it. The timeout bounds a whole worker message (``step_timeout`` times its number of slots), and every slot of a
timed-out or dead actor fails with it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from .base import (STARTUP_TIMEOUT, EnvResult, SlotRunner, WorkerBackend, decode_results, encode_results, error_result,
                   split_by_worker, task_label)

logger = logging.getLogger(__name__)


def connect_ray(address: str | None) -> None:
    """Use the Ray instance this process is connected to, as it is; else ``ray.init(address=address)`` (``None``:
    Ray's own lookup, ``RAY_ADDRESS`` or a new local instance)."""
    import ray

    if ray.is_initialized():
        if address is not None:
            logger.info("EnvPool: Ray is already initialised in this process; ray_address=%r is not used", address)
        return
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)


class RayBackend(WorkerBackend):
    """``num_workers`` Ray actors (:class:`_RayWorker`) of the Ray instance :func:`connect_ray` joins; slot ``i`` lives
    in actor ``i % num_workers``. Actor start-up is waited for separately, so it never counts as env time."""

    def __init__(self, env_factory: Callable[[], Any], num_workers: int, step_timeout: float | None,
                 ray_address: str | None):
        connect_ray(ray_address)
        self.num_workers = num_workers
        self.step_timeout = step_timeout
        self.handles = [_RayWorker(i, env_factory) for i in range(num_workers)]

    def run(self, kind: str, items: list[tuple], slot_tasks: Sequence[Any]) -> tuple[dict[int, EnvResult], list[int]]:
        import ray

        per_worker = split_by_worker(items, self.num_workers)
        for i in per_worker:  # actor start-up (a new process, imports, the factory) is not env time
            self.handles[i].wait_ready(STARTUP_TIMEOUT)
        refs = {self.handles[i].submit(kind, worker_items): i for i, worker_items in per_worker.items()}
        timeout = None if self.step_timeout is None else self.step_timeout * max(len(v) for v in per_worker.values())
        done, not_done = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        results: dict[int, EnvResult] = {}
        failed: dict[int, str] = {}
        for ref in done:
            try:
                results.update(decode_results(ray.get(ref), slot_tasks))
            except Exception as exc:  # noqa: BLE001 - RayActorError and friends
                failed[refs[ref]] = f"worker actor died ({type(exc).__name__}: {exc})"
        for ref in not_done:
            failed[refs[ref]] = f"timed out after {timeout}s"
        for index, reason in failed.items():
            logger.warning("EnvPool: restarting Ray worker %d: %s", index, reason)
            self.handles[index].restart()
            for item in per_worker[index]:
                slot = item[0]
                where = f"slot {slot}, task {task_label(slot_tasks[slot])}"
                results[slot] = error_result(f"{where}: {kind} failed: {reason}")
        return results, list(failed)

    def num_envs_created(self) -> int:
        return sum(worker.count() for worker in self.handles)

    def close(self) -> None:
        for worker in self.handles:
            worker.close()
        self.handles = []


class _RayWorker:
    """One Ray actor holding a ``SlotRunner``."""

    def __init__(self, index: int, env_factory: Callable[[], Any]):
        import ray

        self.index = index
        self.env_factory = env_factory
        self._actor_class = ray.remote(num_cpus=1)(_RayRunner)
        self.actor = self._actor_class.remote(env_factory)
        self.ready = False
        self.pid = None

    def wait_ready(self, timeout: float) -> None:
        """Block until the actor answers (it has started and unpickled the factory); fatal if it cannot."""
        import ray

        if self.ready:
            return
        try:
            ray.get(self.actor.count.remote(), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - GetTimeoutError, RayActorError, ...
            raise RuntimeError(
                f"EnvPool Ray worker {self.index} did not start ({type(exc).__name__}: {exc}); check that env_factory "
                "can be unpickled in a fresh process (defined in an importable module)"
            ) from None
        self.ready = True

    def submit(self, kind: str, items: list[tuple]):
        return self.actor.run.remote(kind, items)

    def count(self) -> int:
        import ray

        return ray.get(self.actor.count.remote())

    def restart(self) -> None:
        import ray

        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001
            pass
        self.actor = self._actor_class.remote(self.env_factory)
        self.ready = False

    def close(self) -> None:
        import ray

        try:
            ray.get(self.actor.close.remote(), timeout=10)
        except Exception:  # noqa: BLE001
            pass
        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001
            pass


class _RayRunner:
    def __init__(self, env_factory: Callable[[], Any]):
        self.runner = SlotRunner(env_factory)

    def run(self, kind: str, items: list[tuple]) -> list[tuple[int, str, bytes]]:
        return encode_results(self.runner, self.runner.run(kind, items))

    def count(self) -> int:
        return self.runner.num_created

    def close(self) -> None:
        self.runner.close()

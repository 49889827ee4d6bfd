"""The in-process backend: every slot's environment in this process, stepped one after another (no subprocess, so
no ``step_timeout``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import EnvResult, SlotRunner, WorkerBackend


class InProcessBackend(WorkerBackend):
    """``num_workers=0``: one :class:`~.base.SlotRunner` in this process."""

    def __init__(self, env_factory: Callable[[], Any]):
        self.runner = SlotRunner(env_factory)
        self.handles = []

    def run(self, kind: str, items: list[tuple], slot_tasks: Sequence[Any]) -> tuple[dict[int, EnvResult], list[int]]:
        return dict(self.runner.run(kind, items)), []

    def num_envs_created(self) -> int:
        return self.runner.num_created

    def close(self) -> None:
        self.runner.close()

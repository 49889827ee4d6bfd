"""The one registry of environment classes: ``(name, protocol) -> class``.

A protocol is a family of environment classes: ``"gigpo-trl"``, this project's own environments, and
``"verl-agent"``, the GiGPO paper's code as its own classes (:mod:`gigpo_trl.envs.verl_agent`). A published number
names its protocol. The rest of the package never tests a protocol string: it asks this registry for a class, and
the class's hooks (``parse_completion``, ``build_messages``) carry the behaviour.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

#: The protocols, the default first.
PROTOCOLS = ("gigpo-trl", "verl-agent")

#: ``{protocol: {env name: "module:Class"}}``; classes are imported on first use (ALFWorld needs ``alfworld``).
ENV_REGISTRY = {
    "gigpo-trl": {
        "webshop": "gigpo_trl.envs.webshop:WebShopEnv",
        "alfworld": "gigpo_trl.envs.alfworld:ALFWorldEnv",
        "frozenlake": "gigpo_trl.envs.frozenlake:FrozenLakeEnv",
        "sokoban": "gigpo_trl.envs.sokoban:SokobanEnv",
        "corridor": "gigpo_trl.envs.corridor:CorridorEnv",
    },
    "verl-agent": {
        "webshop": "gigpo_trl.envs.verl_agent.webshop:PaperWebShopEnv",
        "alfworld": "gigpo_trl.envs.verl_agent.alfworld:PaperALFWorldEnv",
        "sokoban": "gigpo_trl.envs.verl_agent.sokoban:PaperSokobanEnv",
    },
}

#: The default protocol's classes by name (``make_env(name)``).
ENV_CLASSES = ENV_REGISTRY[PROTOCOLS[0]]


def check_protocol(protocol: str) -> str:
    """Return ``protocol`` if it is one of :data:`PROTOCOLS`; raise ``ValueError`` naming the bad value otherwise."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r} is not one of {list(PROTOCOLS)}")
    return protocol


def get_env_class(name: str, protocol: str = PROTOCOLS[0]) -> type:
    """The environment class registered as ``name`` under ``protocol``.

    Raises:
        ValueError: unknown ``protocol``, unknown ``name``, or a ``name`` that ``protocol`` does not cover (the
            message names the value and the choices).
    """
    classes = ENV_REGISTRY[check_protocol(protocol)]
    if name not in classes:
        if name in ENV_CLASSES:
            covered = ", ".join(sorted(classes))
            raise ValueError(f"the {name!r} environment has only the {PROTOCOLS[0]!r} protocol (protocol={protocol!r} "
                             f"covers {covered})")
        raise ValueError(f"unknown environment {name!r}; choose one of {sorted(ENV_CLASSES)}")
    module, attr = classes[name].split(":")
    return getattr(importlib.import_module(module), attr)


def _accepts(cls: type, keyword: str) -> bool:
    params = inspect.signature(cls).parameters
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_env_kwargs(name: str, protocol: str, kwargs: dict[str, Any]) -> None:
    """Refuse a keyword that ``name``'s class under ``protocol`` does not take but another protocol's class does,
    naming the protocol it belongs to (the class's ``protocol_options`` says what it is), rather than a bare
    ``TypeError``.

    Raises:
        ValueError: ``"<keyword> is a protocol='<other>' option (<what>); got <keyword>=<value> with
            protocol='<protocol>'"``.
    """
    cls = get_env_class(name, protocol)
    for keyword, value in kwargs.items():
        if _accepts(cls, keyword):
            continue
        for other in PROTOCOLS:
            other_cls = ENV_REGISTRY[other].get(name)
            if other == protocol or other_cls is None:
                continue
            other_cls = get_env_class(name, other)
            if _accepts(other_cls, keyword):
                what = getattr(other_cls, "protocol_options", {}).get(keyword)
                raise ValueError(f"{keyword} is a protocol={other!r} option{f' ({what})' if what else ''}; got "
                                 f"{keyword}={value!r} with protocol={protocol!r}")


def make_env(name: str, protocol: str = PROTOCOLS[0], **kwargs: Any) -> Any:
    """Instantiate the environment registered as ``name`` under ``protocol`` with ``kwargs``.

    Raises:
        ValueError: as :func:`get_env_class` and :func:`check_env_kwargs`.
    """
    check_env_kwargs(name, protocol, kwargs)
    return get_env_class(name, protocol)(**kwargs)


__all__ = ["ENV_CLASSES", "ENV_REGISTRY", "PROTOCOLS", "check_env_kwargs", "check_protocol", "get_env_class",
           "make_env"]

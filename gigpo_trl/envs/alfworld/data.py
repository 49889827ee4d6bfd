"""ALFWorld's games: the committed offline games (and their ``game.tw-pddl`` files, rebuilt in a cache) and the
official data's splits."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tempfile
import threading
from functools import lru_cache

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
OFFICIAL_SPLITS = ("train", "valid_seen", "valid_unseen")
OFFLINE_SPLITS = ("train", "eval")
DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data",
                         "alfworld", "games.json.gz")
MISSING_PACKAGE = "ALFWorldEnv needs the optional 'alfworld' package: pip install 'gigpo_trl[alfworld]'"


@lru_cache(maxsize=4)
def load_offline(path: str = DATA_FILE) -> dict:
    """The committed games, ``{"games": [...], "by_id": {id: record}, "digest": str}``; each record has id, split,
    task_type, scene, task_desc, pddl_params, pddl_problem and walkthrough. Cached: do not mutate."""
    with open(path, "rb") as f:
        raw = f.read()
    data = json.loads(gzip.decompress(raw))
    data["by_id"] = {g["id"]: g for g in data["games"]}
    data["digest"] = hashlib.sha1(raw).hexdigest()[:12]
    return data


def _alfworld_logic_files() -> tuple[str, str]:
    try:
        import alfworld
    except ImportError as e:  # pragma: no cover - exercised only without the optional dependency
        raise ImportError(MISSING_PACKAGE) from e
    root = os.path.dirname(alfworld.__file__)
    return os.path.join(root, "data", "alfred.pddl"), os.path.join(root, "data", "alfred.twl2")


def default_cache_dir() -> str:
    """``$GIGPO_CACHE/alfworld`` if set, else ``~/.cache/gigpo_trl/alfworld`` (a temp dir if not writable)."""
    root = os.environ.get("GIGPO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gigpo_trl")
    path = os.path.join(root, "alfworld")
    try:
        os.makedirs(path, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return os.path.join(tempfile.gettempdir(), "gigpo_trl", "alfworld")


def _atomic_write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def build_game_file(record: dict, cache_dir: str | None = None) -> str:
    """Write the full ``game.tw-pddl`` (+ ``traj_data.json``) of an offline ``record``; return its path.

    Domain and grammar come from the installed ``alfworld`` wheel; the folder name includes a digest of the
    record and of both files, so a changed wheel or data file never reuses a stale game.
    """
    domain_path, grammar_path = _alfworld_logic_files()
    with open(domain_path) as f:
        domain = f.read()
    with open(grammar_path) as f:
        grammar = f.read()
    blob = json.dumps(record, sort_keys=True) + domain + grammar
    digest = hashlib.sha1(blob.encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", record["id"]) + "-" + digest
    folder = os.path.join(cache_dir or default_cache_dir(), name)
    game_path = os.path.join(folder, "game.tw-pddl")
    if os.path.exists(game_path):
        return game_path
    game = {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", record["task_desc"]),
        "pddl_problem": record["pddl_problem"],
        "solvable": True,
        "walkthrough": record["walkthrough"],
    }
    traj = {"task_type": record["task_type"], "scene": record["scene"], "pddl_params": record["pddl_params"],
            "task_id": record["id"]}
    _atomic_write(os.path.join(folder, "traj_data.json"), json.dumps(traj))
    _atomic_write(game_path, json.dumps(game))
    return game_path


def resolve_official_root(data_dir: str) -> str:
    path = os.path.abspath(os.path.expanduser(os.path.expandvars(str(data_dir))))
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"ALFWorld data directory not found: {path!r} (from data_dir/ALFWORLD_DATA={data_dir!r})"
        )
    if os.path.isdir(os.path.join(path, "json_2.1.1")):
        return os.path.join(path, "json_2.1.1")
    if any(os.path.isdir(os.path.join(path, s)) for s in OFFICIAL_SPLITS):
        return path
    raise FileNotFoundError(
        f"ALFWorld data directory {path!r} has neither json_2.1.1/ nor any of the split folders "
        f"{OFFICIAL_SPLITS}"
    )


_OFFICIAL_INDEX: dict[tuple[str, str], list[tuple[str, str]]] = {}
_INDEX_LOCK = threading.Lock()


def official_games(root: str, split: str) -> list[tuple[str, str]]:
    """Sorted ``(task_id, task_type)`` of the playable games of an official split (cached per process)."""
    key = (root, split)
    with _INDEX_LOCK:
        if key in _OFFICIAL_INDEX:
            return _OFFICIAL_INDEX[key]
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
        raise FileNotFoundError(f"ALFWorld split folder not found: {split_dir!r}")
    out = []
    for dirpath, _, files in os.walk(split_dir):
        if "traj_data.json" not in files or "game.tw-pddl" not in files:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            continue
        with open(os.path.join(dirpath, "traj_data.json")) as f:
            task_type = json.load(f).get("task_type")
        if task_type not in TASK_TYPES:
            continue
        with open(os.path.join(dirpath, "game.tw-pddl")) as f:
            if not json.load(f).get("solvable"):
                continue
        out.append((os.path.relpath(dirpath, root).replace(os.sep, "/"), task_type))
    out.sort()
    with _INDEX_LOCK:
        _OFFICIAL_INDEX[key] = out
    return out


# Importing the `alfworld` package sets ALFWORLD_DATA to its own default (~/.cache/alfworld, created empty) when
# the user did not: remember the user's value from before any such import, so later envs keep the offline games.
_ALFWORLD_DATA_AT_IMPORT = os.environ.get("ALFWORLD_DATA")


def user_alfworld_data() -> str | None:
    """``$ALFWORLD_DATA`` when the user set it (not when ``import alfworld`` wrote its own default), else ``None``."""
    value = os.environ.get("ALFWORLD_DATA") or None
    package_default = os.path.join(os.path.expanduser("~"), ".cache", "alfworld")
    if value and _ALFWORLD_DATA_AT_IMPORT is None and os.path.normpath(value) == os.path.normpath(package_default):
        return None  # set by `import alfworld`, not by the user
    return value

#!/usr/bin/env python
"""Generate a small, offline set of ALFWorld-format text games (no ``alfworld-download`` needed).

Everything comes from files that ship inside the ``alfworld`` wheel:

- ``alfworld/gen/layouts/FloorPlan*-objects.json`` (object types present in a scene) and
  ``FloorPlan*-openable.json`` (receptacle instances with the pose the agent interacts from);
- ``alfworld.gen.constants`` (which receptacle type holds which object type; heatable / coolable /
  cleanable / toggleable objects; which task types fit which room);
- ``alfworld.gen.goal_library`` (PDDL goal and instruction templates per task type);
- ``alfworld/data/alfred.pddl`` and ``alfred.twl2`` (domain and text grammar; the env joins them with the
  problem stored here to rebuild a full ``game.tw-pddl`` at first use).

For each game the generator samples a scene of a room type valid for the task type, places 1-3 instances of
every pickupable object type of the scene in receptacles that can hold them (never a goal object in a
goal receptacle, so no game is won at reset), writes the PDDL problem, and computes a walkthrough with a
scripted expert that knows the initial placement; the walkthrough is then replayed in the real TextWorld
PDDL engine and the game is kept only when it ends with ``won=True`` (and is not won at reset).

The output is one gzip-compressed JSON file holding, per game, only what differs between games (problem,
task text, walkthrough, metadata). Generation is deterministic given ``--seed``.

Usage::

    python scripts/make_alfworld_games.py           # writes gigpo_trl/data/alfworld/games.json.gz
    python scripts/make_alfworld_games.py --num-train 60 --num-eval 30 --seed 0 --out PATH
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
from collections import Counter

from gigpo_trl.envs.alfworld import TASK_TYPES  # the six ALFWorld task types

# Room types by FloorPlan number (ALFRED/AI2-THOR convention).
ROOMS = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231), "Bedroom": range(301, 331),
         "Bathroom": range(401, 431)}
# Scenes used by each split (disjoint, so eval scenes are unseen in training).
SPLIT_SCENES = {"train": lambda n: n % 100 > 6, "eval": lambda n: n % 100 <= 6}
# Receptacles a lamp may stand on (lamps cannot be moved, so they are not in VAL_RECEPTACLE_OBJECTS).
LAMP_STANDS = ["Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand"]
SEED_DEFAULT = 20250517
FORMAT_VERSION = 1
RECORD_KEYS = ("id", "split", "task_type", "scene", "task_desc", "pddl_params", "pddl_problem", "walkthrough")


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------
def _alfworld_paths():
    import alfworld

    root = os.path.dirname(alfworld.__file__)
    return {
        "domain": os.path.join(root, "data", "alfred.pddl"),
        "grammar": os.path.join(root, "data", "alfred.twl2"),
        "layouts": os.path.join(root, "gen", "layouts"),
    }


def mangle(name: str) -> str:
    """PDDL-safe identifier, the inverse of ALFWorld's Demangler."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        name = name.replace(a, b)
    return name


def recep_type(instance_id: str) -> str:
    """Type of a receptacle instance id; a sink's / bathtub's type is the last id segment."""
    parts = instance_id.split("|")
    return parts[-1] if parts[-1].endswith("Basin") else parts[0]


def _coord(rng: random.Random) -> str:
    v = rng.uniform(-3.0, 3.0)
    return ("+" if v >= 0 else "-") + "%05.2f" % abs(v)


def scene_info(scene_num: int, layouts_dir: str, constants) -> dict:
    """Receptacle instances (id -> location tuple) and object types of a scene."""
    with open(os.path.join(layouts_dir, f"FloorPlan{scene_num}-objects.json")) as f:
        types = [t for t in json.load(f) if t in constants.OBJECTS_SET]
    with open(os.path.join(layouts_dir, f"FloorPlan{scene_num}-openable.json")) as f:
        openable = json.load(f)
    static = set(constants.VAL_RECEPTACLE_OBJECTS) - set(constants.MOVABLE_RECEPTACLES)
    receps = {}
    used = set()
    for rid in sorted(openable):
        if recep_type(rid) not in static:
            continue
        x, z, rot, hor = openable[rid]
        loc = (int(round(x / 0.25)), int(round(z / 0.25)), int(rot), int(hor))
        while loc in used:  # one receptacle per location, so "go to X" names a single receptacle
            loc = (loc[0], loc[1], loc[2], loc[3] + 1)
        used.add(loc)
        receps[rid] = loc
    present = {recep_type(r) for r in receps}
    # Receptacle types of the scene that the openable file lacks (stoveburner, coffeemachine, toaster, ...):
    # synthesise instances with deterministic ids and locations.
    srng = random.Random(scene_num * 7919)
    for t in sorted(set(types) & static - present):
        n = 4 if t == "StoveBurner" else 1
        for _ in range(n):
            rid = f"{t}|{_coord(srng)}|{_coord(srng)}|{_coord(srng)}"
            if t.endswith("Basin"):
                rid = f"{t[:-5]}|{_coord(srng)}|{_coord(srng)}|{_coord(srng)}|{t}"
            loc = (srng.randint(-20, 20), srng.randint(-20, 20), srng.choice([0, 90, 180, 270]), 30)
            while loc in used:
                loc = (loc[0] + 1, loc[1], loc[2], loc[3])
            used.add(loc)
            receps[rid] = loc
    return {"receptacles": receps, "types": sorted(set(types))}


def _holders(obj_type: str, receps: dict, constants) -> list[str]:
    return sorted(r for r in receps if obj_type in constants.VAL_RECEPTACLE_OBJECTS.get(recep_type(r), ()))


def _pickupable_types(info: dict, constants) -> list[str]:
    static = set(constants.VAL_RECEPTACLE_OBJECTS) - set(constants.MOVABLE_RECEPTACLES)
    out = []
    for t in info["types"]:
        if t in static or t in constants.VAL_ACTION_OBJECTS["Toggleable"]:
            continue
        if _holders(t, info["receptacles"], constants):
            out.append(t)
    return out


# ----------------------------------------------------------------------------------------------------------
# task sampling
# ----------------------------------------------------------------------------------------------------------
def candidate_params(task_type: str, info: dict, constants) -> list[dict]:
    """All (object, receptacle, toggle) choices of ``task_type`` that the scene supports."""
    receps = info["receptacles"]
    rtypes = sorted({recep_type(r) for r in receps})
    objs = _pickupable_types(info, constants)
    out = []
    if task_type == "look_at_obj_in_light":
        stands = [r for r in receps if recep_type(r) in LAMP_STANDS]
        for lamp in ("DeskLamp", "FloorLamp"):
            if lamp in info["types"] and stands:
                for o in objs:
                    if o not in constants.MOVABLE_RECEPTACLES:
                        out.append({"object_target": o, "parent_target": "", "toggle_target": lamp})
        return out
    need = {"pick_clean_then_place_in_recep": ("Cleanable", "SinkBasin"),
            "pick_heat_then_place_in_recep": ("Heatable", "Microwave"),
            "pick_cool_then_place_in_recep": ("Coolable", "Fridge")}.get(task_type)
    if need is not None and need[1] not in rtypes:
        return []
    for o in objs:
        if need is not None and o not in constants.VAL_ACTION_OBJECTS[need[0]]:
            continue
        holders = {recep_type(r) for r in _holders(o, receps, constants)}
        for r in sorted(holders):
            if need is not None and r == need[1]:
                continue
            # the object must also fit somewhere that is not the goal receptacle type
            others = [h for h in _holders(o, receps, constants) if recep_type(h) != r]
            if not others:
                continue
            out.append({"object_target": o, "parent_target": r, "toggle_target": ""})
    return out


def build_game(task_type: str, scene_num: int, params: dict, rng: random.Random, constants, glib) -> dict:
    """Place objects and write the PDDL problem. Returns the game record (without walkthrough)."""
    info = scene_info(scene_num, _alfworld_paths()["layouts"], constants)
    receps = info["receptacles"]
    target, parent, toggle = params["object_target"], params["parent_target"], params["toggle_target"]

    # --- objects and their initial receptacles
    placements = {}  # object id -> receptacle id
    obj_types = {}
    for t in _pickupable_types(info, constants):
        holders = _holders(t, receps, constants)
        if t == target and parent:
            holders = [h for h in holders if recep_type(h) != parent]
        if not holders:
            continue
        lo = 2 if (t == target and task_type == "pick_two_obj_and_place") else 1
        n = rng.randint(lo, max(lo, 3 if t == target else 2))
        for _ in range(n):
            oid = f"{t}|{_coord(rng)}|{_coord(rng)}|{_coord(rng)}"
            while oid in placements:
                oid = f"{t}|{_coord(rng)}|{_coord(rng)}|{_coord(rng)}"
            placements[oid] = rng.choice(holders)
            obj_types[oid] = t
    lamps = {}
    if toggle:
        stands = sorted(r for r in receps if recep_type(r) in LAMP_STANDS)
        lid = f"{toggle}|{_coord(rng)}|{_coord(rng)}|{_coord(rng)}"
        lamps[lid] = rng.choice(stands)
        obj_types[lid] = toggle

    agent_loc = (rng.randint(-20, 20), rng.randint(-20, 20), rng.choice([0, 90, 180, 270]), 30)
    while agent_loc in set(receps.values()):
        agent_loc = (agent_loc[0] + 1,) + agent_loc[1:]

    def loc_name(loc):
        return "loc|%d|%d|%d|%d" % loc

    # --- PDDL problem
    static = set(constants.VAL_RECEPTACLE_OBJECTS) - set(constants.MOVABLE_RECEPTACLES)
    rtype_names = sorted(set(constants.RECEPTACLES) - set(constants.MOVABLE_RECEPTACLES) | {"SinkBasin"})
    otype_names = sorted(set(constants.OBJECTS_SET) - set(rtype_names))
    objects = []
    objects.append("agent1 - agent")
    objects += [f"{t}Type - otype" for t in otype_names]
    objects += [f"{t}Type - rtype" for t in rtype_names]
    objects += [f"{mangle(o)} - object" for o in sorted(obj_types)]
    objects += [f"{mangle(r)} - receptacle" for r in sorted(receps)]
    locs = sorted({loc_name(l) for l in receps.values()} | {loc_name(agent_loc)})
    objects += [f"{mangle(l)} - location" for l in locs]

    init = ["(= (total-cost) 0)", f"(atLocation agent1 {mangle(loc_name(agent_loc))})"]
    for r in sorted(receps):
        init.append(f"(receptacleType {mangle(r)} {recep_type(r)}Type)")
        init.append(f"(receptacleAtLocation {mangle(r)} {mangle(loc_name(receps[r]))})")
        if recep_type(r) in constants.OPENABLE_CLASS_SET:
            init.append(f"(openable {mangle(r)})")
    for o in sorted(obj_types):
        t = obj_types[o]
        r = placements.get(o) or lamps[o]
        init.append(f"(objectType {mangle(o)} {t}Type)")
        init.append(f"(inReceptacle {mangle(o)} {mangle(r)})")
        init.append(f"(objectAtLocation {mangle(o)} {mangle(loc_name(receps[r]))})")
        if o in placements:
            init.append(f"(pickupable {mangle(o)})")
        for pred, key in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"),
                          ("toggleable", "Toggleable"), ("sliceable", "Sliceable")):
            if t in constants.VAL_ACTION_OBJECTS[key]:
                init.append(f"({pred} {mangle(o)})")
    present_rtypes = sorted({recep_type(r) for r in receps})
    present_otypes = sorted(set(obj_types.values()))
    for rt in present_rtypes:
        for ot in present_otypes:
            if rt in static and ot in constants.VAL_RECEPTACLE_OBJECTS[rt]:
                init.append(f"(canContain {rt}Type {ot}Type)")

    goal = glib.gdict[task_type]["pddl"].format(obj=target, recep=parent, toggle=toggle, mrecep="")
    goal = goal.replace("#", "-").strip()
    assert goal.endswith(")")
    goal = goal[:-1].rstrip()  # the library's goal closes the (define ...) block itself; we do it below

    ind = "\n        "
    problem = (
        f"(define (problem alfred_{task_type}_{scene_num})\n"
        f"    (:domain alfred)\n"
        f"    (:objects{ind}" + ind.join(objects) + "\n    )\n"
        f"    (:init{ind}" + ind.join(init) + "\n    )\n"
        f"    {goal}\n"
        f"    (:metric minimize (total-cost))\n)\n"
    )
    template = rng.choice(glib.gdict[task_type]["templates"])
    task_desc = template.format(obj=target.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
    return {
        "task_type": task_type,
        "scene": f"FloorPlan{scene_num}",
        "task_desc": task_desc,
        "pddl_params": {"object_target": target, "parent_target": parent, "toggle_target": toggle,
                        "mrecep_target": "", "object_sliced": False},
        "pddl_problem": problem,
        "_placements": placements,
        "_lamps": lamps,
    }


# ----------------------------------------------------------------------------------------------------------
# scripted expert (knows the initial placement) + verification in the engine
# ----------------------------------------------------------------------------------------------------------
def scripted_walkthrough(game: dict, names: dict) -> list[str]:
    """Command list solving ``game``; ``names`` maps mangled lower-case ids to demangled display names."""
    p = game["pddl_params"]
    tt = game["task_type"]
    placements, lamps = game["_placements"], game["_lamps"]

    def nm(i):
        return names[mangle(i).lower()]

    openable = {"Fridge", "Cabinet", "Microwave", "Drawer", "Safe", "Box"}
    cmds, state = [], {"at": None, "opened": set()}

    def goto(r):
        if state["at"] != r:
            cmds.append(f"go to {nm(r)}")
            state["at"] = r

    def open_if_needed(r):
        if recep_type(r) in openable and r not in state["opened"]:
            cmds.append(f"open {nm(r)}")
            state["opened"].add(r)

    def fetch(o):
        r = placements[o]
        goto(r)
        open_if_needed(r)
        cmds.append(f"take {nm(o)} from {nm(r)}")

    def first_of(t, exclude=()):
        cands = sorted((o for o in placements if o.split("|")[0] == t and o not in exclude),
                       key=lambda o: nm(placements[o]) + " " + nm(o))
        return cands[0]

    def recep_of_type(t):
        return sorted((r for r in game["_receps"] if recep_type(r) == t), key=nm)[0]

    target = p["object_target"]
    if tt == "look_at_obj_in_light":
        o = first_of(target)
        fetch(o)
        (lamp, stand), = lamps.items()
        goto(stand)
        cmds.append(f"use {nm(lamp)}")
        return cmds
    dest = recep_of_type(p["parent_target"])
    objs = [first_of(target)]
    if tt == "pick_two_obj_and_place":
        objs.append(first_of(target, exclude=objs))
    for o in objs:
        fetch(o)
        verb_recep = {"pick_clean_then_place_in_recep": ("clean", "SinkBasin"),
                      "pick_heat_then_place_in_recep": ("heat", "Microwave"),
                      "pick_cool_then_place_in_recep": ("cool", "Fridge")}.get(tt)
        if verb_recep:
            appl = recep_of_type(verb_recep[1])
            goto(appl)
            cmds.append(f"{verb_recep[0]} {nm(o)} with {nm(appl)}")
        goto(dest)
        open_if_needed(dest)
        cmds.append(f"move {nm(o)} to {nm(dest)}")
    return cmds


def play(game_json: dict, commands: list[str]):
    """Replay ``commands`` in the TextWorld PDDL engine; returns (won_at_reset, won_at_end, trace)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    env = AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True)), shuffle=False)
    env.load(game_json)
    state = env.reset()
    won0 = bool(state["won"])
    trace = []
    for c in commands:
        if c not in state["admissible_commands"]:
            trace.append((c, "NOT ADMISSIBLE"))
            return won0, False, trace
        state, _, done = env.step(c)
        trace.append((c, state["feedback"]))
    return won0, bool(state["won"]), trace


def entity_names(game_json: dict) -> dict:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    env = AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True)), shuffle=False)
    env.load(game_json)
    return {k: info.name.strip() for k, info in env._entity_infos.items()}


def full_game_json(record: dict) -> dict:
    """The ``game.tw-pddl`` content of a record (domain and grammar from the alfworld wheel)."""
    paths = _alfworld_paths()
    with open(paths["domain"]) as f:
        domain = f.read()
    with open(paths["grammar"]) as f:
        grammar = f.read().replace("UNKNOWN GOAL", record["task_desc"])
    return {"pddl_domain": domain, "grammar": grammar, "pddl_problem": record["pddl_problem"],
            "solvable": True, "walkthrough": record.get("walkthrough")}


def make_one(task_type: str, split: str, rng: random.Random, constants, glib, max_tries: int = 50):
    """Sample one solvable, not-won-at-reset game of ``task_type`` from ``split``'s scenes."""
    layouts = _alfworld_paths()["layouts"]
    rooms = constants.GOALS_VALID[task_type]
    scenes = [n for room in sorted(rooms) for n in ROOMS[room] if SPLIT_SCENES[split](n)]
    scenes = [n for n in scenes if os.path.exists(os.path.join(layouts, f"FloorPlan{n}-openable.json"))]
    for _ in range(max_tries):
        scene = rng.choice(scenes)
        info = scene_info(scene, layouts, constants)
        cands = candidate_params(task_type, info, constants)
        if not cands:
            continue
        params = rng.choice(cands)
        game = build_game(task_type, scene, params, rng, constants, glib)
        game["_receps"] = sorted(info["receptacles"])
        gj = full_game_json(game)
        try:
            names = entity_names(gj)
            walk = scripted_walkthrough(game, names)
            won0, won, trace = play(gj, walk)
        except Exception as e:  # a planner/translation failure: resample
            print(f"  skipped FloorPlan{scene} {params}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if won0 or not won:
            print(f"  rejected FloorPlan{scene} {params}: won_at_reset={won0} won={won}", file=sys.stderr)
            continue
        game["walkthrough"] = walk
        for k in ("_placements", "_lamps", "_receps"):
            game.pop(k)
        return game
    raise RuntimeError(f"could not generate a {task_type} game for split {split}")


def generate(num_train: int = 60, num_eval: int = 30, seed: int = SEED_DEFAULT, verbose: bool = True) -> dict:
    """All games as ``{"version", "seed", "games": [record, ...]}``; deterministic given the arguments."""
    import alfworld.gen.constants as constants
    import alfworld.gen.goal_library as glib

    games = []
    for split, n in (("train", num_train), ("eval", num_eval)):
        for i in range(n):
            task_type = TASK_TYPES[i % len(TASK_TYPES)]
            rng = random.Random(f"{seed}/{split}/{i}")  # one stream per game: games regenerate independently
            game = make_one(task_type, split, rng, constants, glib)
            game["id"] = f"{split}/{i:03d}-{task_type}-{game['scene']}"
            game["split"] = split
            games.append({k: game[k] for k in RECORD_KEYS})
            if verbose:
                steps = len(game["walkthrough"])
                print(f"{game['id']}: {game['task_desc']!r}, {steps} steps", file=sys.stderr)
    return {"version": FORMAT_VERSION, "seed": seed, "games": games}


def generate_one(split: str, index: int, seed: int = SEED_DEFAULT) -> dict:
    """Regenerate the single game ``split``/``index`` (for tests comparing with the committed data)."""
    import alfworld.gen.constants as constants
    import alfworld.gen.goal_library as glib

    task_type = TASK_TYPES[index % len(TASK_TYPES)]
    rng = random.Random(f"{seed}/{split}/{index}")
    game = make_one(task_type, split, rng, constants, glib)
    game["id"] = f"{split}/{index:03d}-{task_type}-{game['scene']}"
    game["split"] = split
    return {k: game[k] for k in RECORD_KEYS}


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "gigpo_trl", "data", "alfworld", "games.json.gz")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-train", type=int, default=60)
    ap.add_argument("--num-eval", type=int, default=30)
    ap.add_argument("--seed", type=int, default=SEED_DEFAULT)
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args(argv)
    data = generate(args.num_train, args.num_eval, args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    with open(args.out, "wb") as f:  # mtime=0: byte-identical output for identical input
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
            gz.write(payload)
    counts = Counter((g["split"], g["task_type"]) for g in data["games"])
    print(f"wrote {len(data['games'])} games to {args.out} ({os.path.getsize(args.out)} bytes)")
    for k in sorted(counts):
        print(f"  {k[0]:5s} {k[1]:32s} {counts[k]}")


if __name__ == "__main__":
    main()

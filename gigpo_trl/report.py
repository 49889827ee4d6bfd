"""A run's report: one self-contained HTML page with the training curves and each task group's state graph.

    python -m gigpo_trl.report outputs/run                 # writes outputs/run/report.html
    python -m gigpo_trl.report outputs/run --iterations 1 5 -o report.html

or :func:`build_report`. The page needs no server and no network (plotly.js is embedded once, plotly's offline
HTML); it reads the run's ``trainer_state.json`` (the trainer's log history: the run folder's own, else the newest
checkpoint's) and its rollout records (:mod:`gigpo_trl.records`, written with ``rollout_records=True``):

- **curves**: training success rate, return, invalid-action rate, the share of rows in step groups of size >= 2
  (from the records) and of step groups with >= 2 rows (from the log), loss, KL, and the evaluation points;
- **per chosen iteration, each task group as a graph** (GiGPO Sec. 3.2): a node per anchor state (the step groups
  of the records, merged across the group's trajectories; placed by :func:`networkx.multipartite_layout` in layers
  by the first turn it is reached at), an edge per action (row) from its state to the next one, coloured by A_S,
  and an end node per trajectory marked success or failure. A switch above each graph recolours the same edges by
  each estimator's advantage, recomputed from the records with :func:`gigpo_trl.advantage.compute_gigpo_advantages`
  and the run's settings (GRPO: ω = 0; GiGPO; HGPO: ``step_grouping="hierarchical"``; GraphGPO:
  ``step_return="graph"``, where the estimator has it and the records hold next anchors). Clicking an edge or a node
  opens that trajectory's turn-by-turn transcript below the graph.

Text from environments and from the model is data: it reaches the page only through :func:`html.escape` (in the
transcripts and in plotly's hover and label texts) and plotly's JSON, which escapes ``<`` and ``/``.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .advantage.settings import EstimatorSettings
from .records import load_records, load_settings, record_files, records_dir

REPORT_NAME = "report.html"
# Diverging colours of an advantage: negative red, 0 grey (visible on white), positive blue.
COLORSCALE = [[0.0, "rgb(178,24,43)"], [0.5, "rgb(170,170,170)"], [1.0, "rgb(33,102,172)"]]


# ---------------------------------------------------------------------------------------------------- estimators
def _estimators(records: Sequence[dict] = ()) -> list[tuple[str, dict, str]]:
    """``(label, settings changed from the run's, result field)``; the first is shown by default. GraphGPO when
    every record has its anchor's and next anchor's keys (``anchor_key``, ``next_anchor_key``)."""
    gigpo = {"step_grouping": "state", "step_return": "discounted", "similarity_threshold": None}  # merged already
    out = [
        ("GiGPO A_S (step)", gigpo, "step_advantages"),
        ("GiGPO A = A_E + ω·A_S", gigpo, "advantages"),
        ("GRPO A (= A_E)", {**gigpo, "step_advantage_weight": 0.0}, "advantages"),
        ("HGPO A", {**gigpo, "step_grouping": "hierarchical", "step_advantage_weight": 1.0}, "advantages"),
    ]
    if records and all(r.get("next_anchor_key") and r.get("anchor_key") for r in records):
        out.append(("GraphGPO A", {**gigpo, "step_return": "graph"}, "advantages"))
    return out


def estimator_values(records: Sequence[dict], settings: EstimatorSettings | None = None) -> dict[str, list[float]]:
    """Each estimator's advantage of every record (one training iteration, all ranks, in file order), recomputed
    with :func:`~gigpo_trl.advantage.compute_gigpo_advantages` from the records' rewards, validity flags, task groups,
    trajectories and step groups (``anchor_group``, which already holds a fuzzy run's merged anchors) and the run's
    estimator ``settings`` (``records/settings.json``, see :func:`~gigpo_trl.records.load_settings`; default
    ``EstimatorSettings()``), each estimator changing only the settings that name it; GraphGPO from the anchors'
    and next anchors' keys (``anchor_key``, ``next_anchor_key``). Returns ``{label: [value per record]}``."""
    import numpy as np

    from .advantage import compute_gigpo_advantages

    if not records:
        return {label: [] for label, _, _ in _estimators()}
    settings = settings or EstimatorSettings()
    if settings.step_grouping == "hierarchical":
        settings = settings.replace(step_advantage_weight=1.0)  # the run's own ω has no meaning under HGPO
    rows = dict(
        rewards=np.array([r["reward"] for r in records], dtype=np.float64),
        group_ids=[r["group"] for r in records],
        trajectory_ids=[r["trajectory"] for r in records],
        action_valid=np.array([bool(r["action_valid"]) for r in records]),
    )
    out = {}
    for label, changes, field in _estimators(records):
        graph = changes["step_return"] == "graph"
        anchors = [r["anchor_key"] if graph else r["anchor_group"] for r in records]
        nexts = [r["next_anchor_key"] for r in records] if graph else None
        result = compute_gigpo_advantages(**rows, anchor_states=anchors, next_anchor_states=nexts,
                                          settings=settings.replace(**changes))
        out[label] = [float(v) for v in getattr(result, field)]
    return out


# ---------------------------------------------------------------------------------------------------- inputs
def load_log_history(run_dir: str | Path) -> list[dict]:
    """The trainer's log history: ``run_dir/trainer_state.json`` (``Trainer.save_state``), else the one of the
    newest ``checkpoint-*`` folder; ``[]`` when there is none."""
    run_dir = Path(run_dir)
    candidates = [run_dir / "trainer_state.json"]
    checkpoints = sorted(run_dir.glob("checkpoint-*/trainer_state.json"),
                         key=lambda p: int(p.parent.name.rsplit("-", 1)[-1]) if p.parent.name.rsplit("-", 1)[-1]
                         .isdigit() else -1)
    candidates += checkpoints[::-1]
    for path in candidates:
        if path.is_file():
            return json.loads(path.read_text()).get("log_history", [])
    return []


def _missing_evaluations(run_dir: Path, log_history: Sequence[dict]) -> list[dict]:
    """:func:`eval_history` of the run's evaluation records that the log history does not hold."""
    from .records import read_records

    logged = {(k[: -len("_success_rate")], h.get("step")) for h in log_history for k in h
              if k.startswith("eval") and k.endswith("_success_rate")}
    records, names = [], []
    for path in record_files(run_dir, "eval").get(0, []):
        match = re.match(r"(.+)\.step(\d+)\.rank\d+\.jsonl\.gz$", path.name)
        if match and (match.group(1), int(match.group(2))) not in logged:
            recs = read_records(path)
            records += recs
            names += [match.group(1)] * len(recs)
    return eval_history(records, names) if records else []


# ---------------------------------------------------------------------------------------------------- text
def _hover(text: Any, width: int = 90, limit: int = 900) -> str:
    """Plain text for plotly's hover/labels: escaped (plotly renders a few HTML tags), cut at ``limit`` characters,
    wrapped at ``width`` with ``<br>``."""
    text = "" if text is None else str(text)
    if len(text) > limit:
        text = text[:limit] + " …"
    lines = []
    for para in text.splitlines() or [""]:
        lines += textwrap.wrap(para, width) or [""]
    return "<br>".join(html.escape(line) for line in lines)


def _fmt(x: Any) -> str:
    return "–" if x is None else f"{x:+.3f}" if isinstance(x, float) else html.escape(str(x))


# ---------------------------------------------------------------------------------------------------- curves
_CURVES = [  # (panel title, training key, evaluation suffix)
    ("success rate", "episode/success_rate", "success_rate"),
    ("return R(τ)", "episode/return_mean", "return_mean"),
    ("invalid-action rate", "episode/invalid_action_rate", "invalid_action_rate"),
    ("step groups of size ≥ 2", None, None),
    ("loss", "loss", None),
    ("KL to the reference", "kl", None),
]


def eval_history(eval_records: Sequence[dict], names: Sequence[str]) -> list[dict]:
    """Log-history-like entries (``{"step", f"{name}_success_rate", f"{name}_return_mean",
    f"{name}_invalid_action_rate"}``) of the evaluations in ``eval_records`` (records of ``split="eval"``, each
    with the name of its evaluation in ``names``, same order): one per evaluation. For evaluations the log history
    lacks (``Trainer.train`` starts a new state, so an evaluation before training is not in ``trainer_state.json``)."""
    runs: dict[tuple, list[dict]] = defaultdict(list)
    for rec, name in zip(eval_records, names):
        runs[(name, rec["global_step"])].append(rec)
    out = []
    for (name, step), recs in runs.items():
        ends = {r["trajectory"]: r for r in recs}  # one per trajectory
        out.append({"step": step,
                    f"{name}_success_rate": sum(r["success"] for r in ends.values()) / len(ends),
                    f"{name}_return_mean": sum(r["episode_return"] for r in ends.values()) / len(ends),
                    f"{name}_invalid_action_rate": sum(not r["action_valid"] for r in recs) / len(recs)})
    return out


# The main job's evaluations (``job.evaluate``'s ``when``; metric_key_prefix ``eval_{when}``) as its phase table
# names them; the report's legend uses the same names.
PHASES = {"before": "before", "after_warmup": "after warm-up", "after": "after GiGPO"}


def eval_label(name: str) -> str:
    """The legend label of an evaluation's ``metric_key_prefix``: the job's phases by their :data:`PHASES` name
    (``eval_after_warmup`` -> "evaluation after warm-up", ``eval_after_paper`` -> "evaluation after GiGPO (paper
    draw)"), other names word by word (``eval_step_50`` -> "evaluation step 50"), ``eval`` -> "evaluation"."""
    words = [w for w in name.split("_") if w and w != "eval"]
    paper = words[-1:] == ["paper"]
    phase = "_".join(words[:-1] if paper else words)
    phase = PHASES.get(phase, phase.replace("_", " "))
    return " ".join(["evaluation", phase] if phase else ["evaluation"]) + (" (paper draw)" if paper else "")


def curves_figure(log_history: Sequence[dict], records_by_iteration: dict[int, list[dict]] | None = None):
    """The training curves (a plotly figure, 2 × 3 panels) from ``log_history`` (``trainer_state.json``'s list);
    evaluation entries (``eval*_success_rate`` ...) as markers; the step-group panel from the records (share of
    rows in step groups of size >= 2, at the optimizer step after each recorded rollout) and from the log
    (``1 - anchor/singleton_fraction``: share of step groups with >= 2 rows)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=3, subplot_titles=[t for t, _, _ in _CURVES], horizontal_spacing=0.07,
                        vertical_spacing=0.16)
    palette = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3"]
    eval_names = sorted({k[: -len("_success_rate")] for h in log_history for k in h
                         if k.startswith("eval") and k.endswith("_success_rate")})
    for i, (title, key, eval_suffix) in enumerate(_CURVES):
        row, col = divmod(i, 3)
        row, col = row + 1, col + 1
        drawn = False
        if key is not None:
            points = [(h["step"], h[key]) for h in log_history if key in h and "step" in h]
            if points:
                fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers",
                                         name=f"train {title}", line={"color": palette[0]}, showlegend=False),
                              row=row, col=col)
                drawn = True
        if eval_suffix is not None:
            for j, name in enumerate(eval_names):
                k = f"{name}_{eval_suffix}"
                points = [(h["step"], h[k]) for h in log_history if k in h and "step" in h]
                if points:
                    fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="markers",
                                             name=eval_label(name), marker={"size": 11, "symbol": "diamond",
                                                                "color": palette[(j + 1) % len(palette)]},
                                             legendgroup=name, showlegend=i == 0), row=row, col=col)
                    drawn = True
        if key is None:  # step groups
            if records_by_iteration:
                xs, ys = [], []
                for recs in records_by_iteration.values():
                    if recs:
                        xs.append(recs[0]["global_step"] + 1)
                        ys.append(sum(1 for r in recs if (r["anchor_group_size"] or 0) >= 2) / len(recs))
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name="rows in step groups ≥ 2 (records)",
                                         line={"color": palette[3]}), row=row, col=col)
                drawn = True
            points = [(h["step"], 1.0 - h["anchor/singleton_fraction"]) for h in log_history
                      if "anchor/singleton_fraction" in h and "step" in h]
            if points:
                fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers",
                                         name="step groups with ≥ 2 rows (log)", line={"color": palette[4],
                                                                                        "dash": "dot"}),
                              row=row, col=col)
                drawn = True
        if not drawn:
            axes = fig.get_subplot(row, col)  # the panel's centre, in paper coordinates
            fig.add_annotation(text="not logged in this run", x=sum(axes.xaxis.domain) / 2,
                               y=sum(axes.yaxis.domain) / 2, xref="paper", yref="paper", showarrow=False,
                               font={"color": "#888"})
        fig.update_xaxes(title_text="optimizer step", row=row, col=col)
    fig.update_layout(height=560, margin={"l": 40, "r": 20, "t": 50, "b": 40}, template="plotly_white",
                      legend={"orientation": "h", "y": -0.12})
    return fig


# ---------------------------------------------------------------------------------------------------- group graphs
def state_graph(records: Sequence[dict]):
    """``(graph, state_label)`` of one task group's records (trajectories' rows in turn order): a
    ``networkx.MultiDiGraph`` with a node ``("s", anchor_group)`` per anchor state (attributes ``layer``: its
    earliest turn, ``first``: its first record's index, ``rows``: its records' indices) and ``("end", trajectory)``
    per trajectory (``layer``: last turn + 1, ``success``, ``first``: the last record's index), and an edge per record
    (key: its index) from its state to the next row's state or to its trajectory's end; ``state_label`` names the
    states ``S1``, ``S2``, ... in order of first appearance."""
    import networkx as nx

    by_traj: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_traj[r["trajectory"]].append(i)
    graph = nx.MultiDiGraph()
    state_label: dict[Any, str] = {}
    for i, r in enumerate(records):
        node = ("s", r["anchor_group"])
        if node not in graph:
            state_label[node] = f"S{len(state_label) + 1}"
            graph.add_node(node, layer=r["turn"], first=i, rows=[])
        graph.nodes[node]["layer"] = min(graph.nodes[node]["layer"], r["turn"])
        graph.nodes[node]["rows"].append(i)
    for t, idx in by_traj.items():
        idx = sorted(idx, key=lambda i: records[i]["turn"])
        last = records[idx[-1]]
        end = ("end", t)
        graph.add_node(end, layer=last["turn"] + 1, success=bool(last["success"]), first=idx[-1], rows=[])
        for a, b in zip(idx, idx[1:] + [None]):
            target = ("s", records[b]["anchor_group"]) if b is not None else end
            graph.add_edge(("s", records[a]["anchor_group"]), target, key=a)
    return graph, state_label


def _colour_buttons(fig, values: dict[str, list[float]], edge_rows: list[int]) -> list[dict]:
    """The graph's restyle buttons, one per estimator in ``values``: each colours the edge traces (the first
    ``len(edge_rows)`` of ``fig.data``, edge ``j`` being record ``edge_rows[j]``) by that estimator's advantage on a
    symmetric scale and retitles the colour bar (``fig.data[-1]``); the first button's colouring is applied now."""
    from plotly.colors import sample_colorscale

    n_edges = len(edge_rows)
    labels = list(values)
    buttons = []
    for lab in labels:
        edge_values = [values[lab][i] for i in edge_rows]
        span = max([abs(v) for v in edge_values] + [0.0]) or 1.0  # all 0: a readable ±1 scale, grey edges
        colors = sample_colorscale(COLORSCALE, [0.5 + 0.5 * v / span for v in edge_values]) if edge_values else []
        update = {"line.color": colors + ["#000"] * 3, "marker.color": colors + ["#e8e8e8", None, [-span, span]],
                  "marker.colorbar.title.text": [None] * (n_edges + 2) + [html.escape(lab)]}
        buttons.append({"label": html.escape(lab), "method": "restyle", "args": [update, list(range(n_edges + 3))]})
    if buttons:  # the default colouring: apply the first button's values now
        first = buttons[0]["args"][0]
        for j, tr in enumerate(fig.data[:n_edges]):
            tr.line.color = first["line.color"][j]
            tr.marker.color = first["marker.color"][j]
        fig.data[-1].marker.color = first["marker.color"][-1]
        fig.data[-1].marker.colorbar.title.text = html.escape(labels[0])
        # the end-node colours must survive the restyle: None leaves a trace's value as it is
        for b in buttons:
            b["args"][0]["marker.color"][n_edges + 1] = fig.data[n_edges + 1].marker.color
    return buttons


def group_graph(records: Sequence[dict], values: dict[str, list[float]], prefix: str):
    """One task group's state graph.

    Args:
        records: the group's records (one training iteration), trajectories' rows in turn order.
        values: ``{estimator label: advantage per record}`` (:func:`estimator_values`, same order); the first is
            the default colouring.
        prefix: id prefix of the transcript elements this graph links to (``{prefix}-t{k}`` for the ``k``-th
            trajectory's ``<details>``, ``{prefix}-t{k}-{turn}`` for a turn's row).

    Returns:
        ``(networkx.MultiDiGraph, plotly figure)``: nodes ``("s", anchor_group)`` per anchor state and
        ``("end", trajectory)`` per trajectory, an edge per record (key: its index in ``records``). The figure's
        traces: one per edge (named ``"action"``), then ``"state"`` (anchor nodes), ``"end"`` (end nodes) and
        ``"scale"`` (the colour bar).
    """
    import networkx as nx
    import plotly.graph_objects as go

    graph, state_label = state_graph(records)
    traj_index = {t: k for k, t in enumerate(dict.fromkeys(r["trajectory"] for r in records))}
    pos = nx.multipartite_layout(graph, subset_key="layer")

    labels = list(values)
    edges = list(graph.edges(keys=True))
    fig = go.Figure()
    pair_count: dict[tuple, int] = defaultdict(int)
    for u, v, i in edges:
        r = records[i]
        pair = (u, v) if str(u) <= str(v) else (v, u)
        k = pair_count[pair]
        pair_count[pair] += 1
        xs, ys = _edge_path(pos[u], pos[v], k, u == v)
        text = (f"<b>{html.escape(r['trajectory'])}, turn {r['turn']}</b><br>action: {_hover(r['action'], limit=200)}"
                f" ({'valid' if r['action_valid'] else 'invalid'})<br>reward {r['reward']:+.3f}, return-to-go "
                f"{r['return_to_go']:+.3f}<br>" + "<br>".join(f"{html.escape(lab)}: {values[lab][i]:+.4f}"
                                                             for lab in labels))
        row_id = f"{prefix}-t{traj_index[r['trajectory']]}-{r['turn']}"
        mid = len(xs) // 2
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name="action", hoverinfo="text", hovertext=[text] * len(xs),
            customdata=[row_id] * len(xs), line={"width": 2.5},
            marker={"symbol": "arrow", "angleref": "previous", "size": [0 if j != mid else 13 for j in range(len(xs))]},
            showlegend=False, meta={"trajectory": r["trajectory"], "turn": r["turn"],
                                    "advantages": {lab: values[lab][i] for lab in labels}}))
    states = [n for n in graph if n[0] == "s"]
    ends = [n for n in graph if n[0] == "end"]

    def node_hover(n):
        first = records[graph.nodes[n]["first"]]
        if n[0] == "end":
            return (f"<b>end of {html.escape(n[1])}</b>: {'success' if first['success'] else 'failure'}, return "
                    f"{first['episode_return']:+.3f}")
        rows = graph.nodes[n]["rows"]
        return (f"<b>{state_label[n]}</b>: step group of {len(rows)} row(s), turn(s) "
                f"{', '.join(str(t) for t in sorted({records[i]['turn'] for i in rows}))}<br>"
                f"{_hover(first['observation'], limit=600)}")

    def node_target(n):
        first = records[graph.nodes[n]["first"]]
        return f"{prefix}-t{traj_index[first['trajectory']]}" if n[0] == "end" else \
            f"{prefix}-t{traj_index[first['trajectory']]}-{first['turn']}"

    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in states], y=[pos[n][1] for n in states], mode="markers+text", name="state",
        text=[state_label[n] for n in states], textposition="top center", hoverinfo="text",
        hovertext=[node_hover(n) for n in states], customdata=[node_target(n) for n in states],
        marker={"size": [14 + 3 * min(len(graph.nodes[n]["rows"]), 8) for n in states], "color": "#e8e8e8",
                "line": {"color": "#444", "width": 1.5}}, showlegend=False))
    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in ends], y=[pos[n][1] for n in ends], mode="markers+text", name="end",
        text=["✓" if graph.nodes[n]["success"] else "✗" for n in ends], textposition="middle right",
        textfont={"color": ["#1a7f37" if graph.nodes[n]["success"] else "#c62828" for n in ends], "size": 16},
        hoverinfo="text", hovertext=[node_hover(n) for n in ends], customdata=[node_target(n) for n in ends],
        marker={"size": 16, "symbol": ["star" if graph.nodes[n]["success"] else "x" for n in ends],
                "color": ["#1a7f37" if graph.nodes[n]["success"] else "#c62828" for n in ends]},
        showlegend=False))
    x0, y0 = (pos[states[0]] if states else (0.0, 0.0))
    fig.add_trace(go.Scatter(x=[x0, x0], y=[y0, y0], mode="markers", name="scale", hoverinfo="skip",
                             marker={"opacity": 0, "color": [0.0, 0.0], "colorscale": COLORSCALE, "cmid": 0,
                                     "showscale": True, "colorbar": {"thickness": 12, "len": 0.8}},
                             showlegend=False))
    buttons = _colour_buttons(fig, values, [i for _, _, i in edges])
    layers = defaultdict(int)
    for n in graph:
        layers[graph.nodes[n]["layer"]] += 1
    height = 260 + 45 * max(layers.values(), default=1)
    fig.update_layout(
        height=min(height, 900), margin={"l": 10, "r": 10, "t": 40, "b": 10}, template="plotly_white",
        hovermode="closest", hoverlabel={"align": "left"},
        xaxis={"visible": False}, yaxis={"visible": False},
        updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons, "x": 0, "y": 1.0,
                      "xanchor": "left", "yanchor": "bottom", "pad": {"t": 2, "b": 2}, "showactive": True,
                      "font": {"size": 11}}] if len(buttons) > 1 else [],
    )
    return graph, fig


def _edge_path(p, q, k: int, loop: bool) -> tuple[list[float], list[float]]:
    """Points of an edge's polyline: straight for the first edge between two nodes, bent alternately to either side
    for the next ones (parallel actions stay visible), a small loop above the node for a self-loop."""
    (x0, y0), (x1, y1) = (float(p[0]), float(p[1])), (float(q[0]), float(q[1]))
    if loop:  # a circle through the node, above it, larger for each further loop
        r = 0.05 * (1 + 0.6 * k)
        angles = [-math.pi / 2 + 2 * math.pi * j / 12 for j in range(13)]
        return [x0 + r * math.cos(a) for a in angles], [y0 + r + r * math.sin(a) for a in angles]
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    dx, dy = x1 - x0, y1 - y0
    norm = math.hypot(dx, dy) or 1.0
    side = 0 if k == 0 else (1 if k % 2 else -1) * ((k + 1) // 2)
    off = 0.07 * side
    return [x0, mx - dy / norm * off, x1], [y0, my + dx / norm * off, y1]


# ---------------------------------------------------------------------------------------------------- page
def _transcripts(records: Sequence[dict], values: dict[str, list[float]], prefix: str) -> str:
    by_traj: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_traj[r["trajectory"]].append(i)
    labels = list(values)
    out = []
    for k, (t, idx) in enumerate(by_traj.items()):
        idx = sorted(idx, key=lambda i: records[i]["turn"])
        last = records[idx[-1]]
        outcome = "success ✓" if last["success"] else "failure ✗"
        head = "".join(f"<th>{html.escape(lab)}</th>" for lab in labels)
        rows = []
        for i in idx:
            r = records[i]
            cells = "".join(f"<td>{_fmt(values[lab][i])}</td>" for lab in labels)
            rows.append(
                f'<tr id="{prefix}-t{k}-{r["turn"]}"><td>{r["turn"]}</td>'
                f'<td><pre>{html.escape(str(r["observation"] or ""))}</pre></td>'
                f'<td><pre>{html.escape(str(r["completion"] or ""))}</pre></td>'
                f'<td><pre>{html.escape(str(r["action"] or ""))}</pre>{"" if r["action_valid"] else " (invalid)"}</td>'
                f'<td>{r["reward"]:+.3f}</td><td>{r["return_to_go"]:+.3f}</td><td>{r["anchor_group_size"]}</td>'
                f'{cells}</tr>')
        out.append(
            f'<details id="{prefix}-t{k}"><summary>trajectory {html.escape(t)}: {outcome}, return '
            f'{last["episode_return"]:+.3f}, {len(idx)} turn(s)</summary><table><thead><tr><th>turn</th>'
            f'<th>observation</th><th>completion</th><th>action</th><th>reward</th><th>return-to-go</th>'
            f'<th>step group size</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></details>')
    return "\n".join(out)


_CLICK_JS = """
var gd = document.getElementById('{plot_id}');
gd.on('plotly_click', function (ev) {
  var p = ev.points && ev.points[0];
  if (!p || typeof p.customdata !== 'string') return;
  var el = document.getElementById(p.customdata);
  if (!el) return;
  var det = el.tagName === 'DETAILS' ? el : el.closest('details');
  if (det) det.open = true;
  el.scrollIntoView({block: 'center'});
  el.classList.add('hit');
  setTimeout(function () { el.classList.remove('hit'); }, 1600);
});
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; } h3 { font-size: 1.05em; }
.meta { color: #555; font-size: 0.9em; }
section.group { border: 1px solid #e4e4e4; border-radius: 6px; padding: 0.4em 0.8em; margin: 1em 0; }
details { margin: 0.25em 0; } summary { cursor: pointer; }
table { border-collapse: collapse; font-size: 0.82em; width: 100%; }
td, th { border: 1px solid #ddd; padding: 2px 4px; vertical-align: top; text-align: left; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; max-height: 14em; overflow: auto; }
tr.hit, details.hit { background: #fff3b0; }
"""


def build_report(run_dir: str | Path, output: str | Path | None = None, iterations: Sequence[int] | None = None,
                 max_groups: int = 16) -> Path:
    """Write the run's report page and return its path.

    Args:
        run_dir: the run's ``output_dir`` (holding ``records/`` and ``trainer_state.json`` or checkpoints).
        output: where to write the page. Default: ``run_dir/report.html``.
        iterations: the recorded training iterations to draw the task groups of. Default: the first and the last
            recorded one.
        max_groups: draw at most this many task groups per iteration (the first ones).

    Raises:
        FileNotFoundError: ``run_dir`` does not exist, or has neither rollout records nor a log history, or a
            requested iteration was not recorded (the message lists the recorded ones).
    """
    import plotly.io as pio

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder not found: {str(run_dir)!r}")
    files = record_files(run_dir, "train")
    log_history = load_log_history(run_dir)
    if not files and not log_history:
        raise FileNotFoundError(
            f"{str(run_dir)!r} has no rollout records ({records_dir(run_dir)}; train with rollout_records=True) and "
            "no trainer_state.json (Trainer.save_state() or a checkpoint): nothing to report")
    if iterations is None:
        iterations = sorted({min(files), max(files)}) if files else []
    missing = [i for i in iterations if i not in files]
    if missing:
        raise FileNotFoundError(f"iteration(s) {missing} were not recorded in {records_dir(run_dir) / 'train'} "
                                f"(recorded: {sorted(files) or 'none'})")
    settings, run_fields = load_settings(run_dir)
    by_iteration = {it: load_records(run_dir, "train", it) for it in files}
    log_history = list(log_history) + _missing_evaluations(run_dir, log_history)
    parts = [pio.to_html(curves_figure(log_history, by_iteration), full_html=False, include_plotlyjs=True,
                         div_id="curves", config={"displaylogo": False})]
    body = [f"<h2>Training curves</h2>{parts[0]}"]
    for it in iterations:
        records = by_iteration[it]
        values = estimator_values(records, settings)
        groups: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(records):
            groups[r["group"]].append(i)
        shared = sum(1 for r in records if (r["anchor_group_size"] or 0) >= 2)
        body.append(
            f'<h2 id="iteration-{it}">Iteration {it}</h2><p class="meta">{len(records)} rows in {len(groups)} task '
            f"group(s); {shared} of them ({shared / max(len(records), 1):.0%}) in step groups of size ≥ 2. Edges: "
            "one action each, coloured by the advantage chosen above the graph (blue positive, red negative); "
            "nodes: anchor states (S1, S2, ... merged across the group's trajectories, size by visits) and each "
            "trajectory's end (✓ success, ✗ failure). Click an edge or a node for the transcript.</p>")
        for j, (group, idx) in enumerate(list(groups.items())[:max_groups]):
            recs = [records[i] for i in idx]
            vals = {lab: [v[i] for i in idx] for lab, v in values.items()}
            prefix = f"it{it}-g{j}"
            _, fig = group_graph(recs, vals, prefix)
            wins = len({r["trajectory"] for r in recs if r["success"]})
            n_traj = len({r["trajectory"] for r in recs})
            figure = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"graph-{prefix}",
                                 post_script=_CLICK_JS, config={"displaylogo": False})
            body.append(
                f'<section class="group" id="{prefix}"><h3>Task {html.escape(str(recs[0]["task"]))}'
                f'{" (" + html.escape(str(recs[0]["task_type"])) + ")" if recs[0]["task_type"] else ""}: '
                f"{n_traj} trajectories, {wins} successful, {len(recs)} rows</h3>{figure}"
                f'<div class="transcripts">{_transcripts(recs, vals, prefix)}</div></section>')
        if len(groups) > max_groups:
            body.append(f'<p class="meta">{len(groups) - max_groups} more task group(s) not drawn '
                        "(max_groups).</p>")
    recorded = ", ".join(str(i) for i in files) or "none"
    setting_text = ", ".join(f"{k}={v}" for k, v in {**settings.to_dict(), **run_fields}.items())
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>GiGPO report: '
        f'{html.escape(run_dir.name)}</title><style>{_STYLE}</style></head><body>'
        f"<h1>GiGPO run report: {html.escape(str(run_dir))}</h1>"
        f'<p class="meta">Recorded iterations: {html.escape(recorded)}. Settings: {html.escape(setting_text)}.</p>'
        + "\n".join(body) + "</body></html>")
    out = Path(output) if output is not None else run_dir / REPORT_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m gigpo_trl.report RUN_DIR [--iterations N ...] [-o FILE] [--max-groups K]``: prints the page's
    path; exit 2 with one ``[gigpo] error`` line when the run has nothing to report."""
    parser = argparse.ArgumentParser(prog="python -m gigpo_trl.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's output_dir")
    parser.add_argument("-o", "--output", default=None, help=f"the page to write (default: RUN_DIR/{REPORT_NAME})")
    parser.add_argument("--iterations", type=int, nargs="+", default=None,
                        help="recorded iterations to draw (default: the first and the last)")
    parser.add_argument("--max-groups", type=int, default=16, help="task groups drawn per iteration (default 16)")
    args = parser.parse_args(argv)
    try:
        path = build_report(args.run_dir, args.output, args.iterations, args.max_groups)
    except (FileNotFoundError, ValueError) as exc:
        print(f"[gigpo] error: {exc}", file=sys.stderr)
        return 2
    print(f"[gigpo] report written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["PHASES", "build_report", "curves_figure", "estimator_values", "eval_history", "eval_label",
           "group_graph", "load_log_history", "main", "state_graph"]

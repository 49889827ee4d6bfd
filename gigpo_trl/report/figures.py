"""The report's figures (plotly): the training curves and each task group's anchor-state graph, its edges coloured
by an estimator's advantage."""

from __future__ import annotations

import html
import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .data import PHASES

# Diverging colours of an advantage: negative red, 0 grey (visible on white), positive blue.
COLORSCALE = [[0.0, "rgb(178,24,43)"], [0.5, "rgb(170,170,170)"], [1.0, "rgb(33,102,172)"]]


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


_CURVES = [  # (panel title, training key, evaluation suffix)
    ("success rate", "episode/success_rate", "success_rate"),
    ("return R(τ)", "episode/return_mean", "return_mean"),
    ("invalid-action rate", "episode/invalid_action_rate", "invalid_action_rate"),
    ("step groups of size ≥ 2", None, None),
    ("loss", "loss", None),
    ("KL to the reference", "kl", None),
]


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

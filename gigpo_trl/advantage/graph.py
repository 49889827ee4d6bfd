"""GraphGPO's step return (Cheng, He, Feng et al., *Beyond Trajectory-Level Attribution: Graph-Based Credit
Assignment for Agentic Reinforcement Learning*, arXiv 2605.26684), as its authors' recipe computes it
(``recipe/GraphGPO`` of langfengQ/verl-agent).

Per task group, the rows' transitions form a directed graph: one edge ``anchor state -> next state`` per row,
where the last row of a trajectory whose episode reward is > 0 leads to the node *success* instead of its final
observation (:func:`transition_graph`). ``d(s)`` is the length of the shortest path from ``s`` to success, and
a state with no such path gets the group's largest finite distance plus one (:func:`distances_to_success`).
An action's step return is read off where it led, with no discounting along the trajectory
(:func:`graph_step_returns`):

* ``10 * gamma ** d(s')`` (``normalize_distance=False``, every run script of the recipe), or
* ``10 * gamma ** (d(s') - d(s) + 1)`` (``normalize_distance=True``: progress towards success).

The rest is GiGPO's: the invalid-action penalty is subtracted from this return, ``A_S`` normalises it within
the step groups (same task group, same anchor state), ``A = A_E + omega * A_S``.

The shortest paths are one breadth-first search backwards from success over the whole batch (all edges weigh 1,
so it equals the recipe's Dijkstra; the task groups' graphs share no state, and success has no outgoing
edge, so one search serves every group), vectorised over edges: one pass per distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rows import pair_codes

#: The recipe's return of reaching success (its ``10 * gamma ** d``; the success reward of ALFWorld and WebShop).
SUCCESS_RETURN = 10.0


@dataclass
class TransitionGraph:
    """The transitions of a batch as one graph over states; every array is int64.

    ``source``/``target`` ``(R,)``: node of each row's anchor state and of the state its action led to
    (``success`` for the last row of a trajectory with episode reward > 0). Nodes ``0..n_states-1`` are
    (task group, state) pairs, so groups never share one; node ``success = n_states`` is every group's goal.
    ``node_group`` ``(n_states,)``: the task group of each state node.
    """

    source: np.ndarray
    target: np.ndarray
    success: int
    node_group: np.ndarray


def transition_graph(group_codes, anchor_codes, next_codes, n_states, last_row, succeeded) -> TransitionGraph:
    """One edge per row, ``(task group, anchor state) -> (task group, next state)`` (multi-edges kept).

    ``group_codes``, ``anchor_codes``, ``next_codes`` ``(R,)``: codes of the row's task group and, in one code
    space ``0..n_states-1``, of its anchor state and of the anchor of the observation its action returned.
    ``last_row`` ``(R,)`` bool: the row ends its trajectory; ``succeeded`` ``(R,)`` bool: its trajectory's
    episode reward is > 0. Such a last row leads to success (the recipe's collector writes ``'success'`` as
    its next observation).
    """
    n = len(group_codes)
    nodes, n_nodes = pair_codes(np.concatenate([group_codes, group_codes]), np.concatenate([anchor_codes, next_codes]),
                                n_states)
    source, target = nodes[:n], nodes[n:].copy()
    target[last_row & succeeded] = n_nodes
    node_group = np.zeros(n_nodes, dtype=np.int64)
    node_group[nodes] = np.concatenate([group_codes, group_codes])
    return TransitionGraph(source, target, n_nodes, node_group)


def hops_to_success(graph: TransitionGraph) -> np.ndarray:
    """``(n_states + 1,)`` int: the fewest edges from each node to success, ``-1`` where there is no path.

    Breadth-first search backwards from success: the states at distance ``d + 1`` are the unvisited sources of
    edges into the states at distance ``d``.
    """
    hops = np.full(graph.success + 1, -1, dtype=np.int64)
    hops[graph.success] = 0
    frontier = np.zeros(graph.success + 1, dtype=bool)
    frontier[graph.success] = True
    d = 0
    while True:
        reached = graph.source[frontier[graph.target] & (hops[graph.source] < 0)]
        if len(reached) == 0:
            return hops
        d += 1
        hops[reached] = d
        frontier[:] = False
        frontier[reached] = True


def distances_to_success(graph: TransitionGraph, hops: np.ndarray, n_groups: int) -> np.ndarray:
    """``d(s)`` ``(n_states + 1,)`` float: ``hops``, with the recipe's rule for a state that cannot reach success.

    Such a state gets ``D_g + 1``, ``D_g`` the largest finite distance in its task group's graph (0 when no
    trajectory of the group succeeded: then every state gets 1 and all step returns are equal).
    """
    states = hops[:-1]
    largest = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(largest, graph.node_group, states)  # -1 never wins over the initial 0
    d = np.where(states >= 0, states, largest[graph.node_group] + 1)
    return np.append(d, 0).astype(np.float64)


def graph_step_returns(d: np.ndarray, graph: TransitionGraph, gamma: float, normalize_distance: bool) -> np.ndarray:
    """The step return of each row ``(R,)``, read off the graph (before the invalid-action penalty).

    ``SUCCESS_RETURN * gamma ** d(s')``, or with ``normalize_distance``
    ``SUCCESS_RETURN * gamma ** (d(s') - d(s) + 1)``, ``s`` the row's anchor state and ``s'`` where it led.
    """
    exponent = d[graph.target] - d[graph.source] + 1.0 if normalize_distance else d[graph.target]
    return SUCCESS_RETURN * np.power(gamma, exponent)

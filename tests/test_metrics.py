"""gigpo_trl/metrics.py: the per-iteration metric dicts on hand-built inputs. graph_metrics is checked on the
hand-built GraphGPO graph of tests/test_graphgpo.py (test_graph_metrics_by_hand); the logged episode, anchor and
completion metrics of a run in tests/test_env_adapters.py and tests/test_faults.py."""

import numpy as np
import pytest

from gigpo_trl.metrics import level_metrics


def test_level_metrics():
    ids = np.array([[0, 0], [0, 0], [0, 1], [1, 2]])  # level 0: sizes 3, 1; level 1: sizes 2, 1, 1
    m = level_metrics(ids)
    assert m["anchor/level_0/group_size_mean"] == 2.0 and m["anchor/level_0/singleton_fraction"] == 0.5
    assert m["anchor/level_1/group_size_mean"] == pytest.approx(4 / 3)
    assert m["anchor/level_1/singleton_fraction"] == pytest.approx(2 / 3)
    assert m["anchor/level_1/row_group_size_mean"] == pytest.approx((4 + 1 + 1) / 4)
    assert m["anchor/level_1/num_groups"] == 3.0 and level_metrics(np.zeros((0, 2))) == {}
    # -1: the row has no such level (turn t < k); left out of that level's figures
    m = level_metrics(np.array([[0, -1], [0, 0], [0, 0], [1, -1]]))
    assert m["anchor/level_1/num_groups"] == 1.0 and m["anchor/level_1/row_group_size_mean"] == 2.0
    assert "anchor/level_1/num_groups" not in level_metrics(np.array([[0, -1], [0, -1]]))

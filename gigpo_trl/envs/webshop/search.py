"""WebShop search: a BM25 index over the products of one data source, and the per-process cache of stores.

A store holds a data source's products, goal splits and index; all environment instances of a process share it
(:func:`get_store`), so the index is built once per source.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import numpy as np

from .data import load_bundled, load_webshop_dir

MAX_RESULTS = 50
_STOPWORDS = frozenset(
    "a an the and or of in on at to for with from by is are be it its this that these those i me my we "
    "you your am do does not no as into than then so".split()
)


def tokenize(text: str) -> list[str]:
    """Search tokens: lowercase alphanumeric words without stopwords, plural ``s`` stripped."""
    out = []
    for tok in re.findall(r"[0-9a-z]+", str(text).lower()):
        if tok in _STOPWORDS:
            continue
        if len(tok) > 3 and tok.endswith("s") and not tok.endswith(("ss", "us")):
            tok = tok[:-1]
        out.append(tok)
    return out


class _Store:
    """Products, goal splits and the BM25 index of one data source."""

    def __init__(self, products: list[dict], splits: dict[str, list[dict]], source: str):
        import bm25s

        self.source = source
        self.products = products
        self.by_asin = {p["asin"].lower(): i for i, p in enumerate(products)}
        self.splits = splits
        self.goal_by_id = {g["id"]: g for goals in splits.values() for g in goals}
        corpus = []
        for p in products:
            toks = tokenize(" ".join([p["title"], " ".join(p["attributes"]), p.get("category", ""),
                                      p.get("product_type", "")]))
            corpus.append(toks or ["empty"])
        self.bm25 = bm25s.BM25()
        self.bm25.index(corpus, show_progress=False)
        self._search_cache: dict[tuple, list[int]] = {}

    def search(self, query: str, k: int = MAX_RESULTS) -> list[int]:
        """Indices of the top-``k`` products for ``query`` (score > 0; ties broken by catalog order)."""
        toks = tuple(t for t in tokenize(query) if t in self.bm25.vocab_dict and t)
        key = (toks, k)
        hit = self._search_cache.get(key)
        if hit is not None:
            return hit
        if not toks:
            result: list[int] = []
        else:
            scores = np.asarray(self.bm25.get_scores(list(toks)), dtype=np.float64)
            cand = np.flatnonzero(scores > 0)
            order = cand[np.lexsort((cand, -scores[cand]))][:k]
            result = [int(i) for i in order]
        if len(self._search_cache) < 100_000:
            self._search_cache[key] = result
        return result


_STORES: dict[tuple, _Store] = {}
_STORES_LOCK = threading.Lock()


def _get_store(key: tuple, builder) -> _Store:
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = builder()
            _STORES[key] = store
        return store


def get_store(data_dir: str | Path | None = None, variant: str = "1000") -> _Store:
    """The (cached) store of a data source: bundled when ``data_dir`` is None (and ``WEBSHOP_DATA`` unset)
    or ``"bundled"``, else the real WebShop files in ``data_dir``."""
    if data_dir is None:
        data_dir = os.environ.get("WEBSHOP_DATA") or None
    if data_dir is None or str(data_dir) == "bundled":
        return _get_store(("bundled",), lambda: _Store(*load_bundled(), source="bundled"))
    path = Path(data_dir).expanduser().resolve()
    return _get_store(("dir", str(path), variant),
                      lambda: _Store(*load_webshop_dir(path, variant), source=str(path)))


__all__ = ["MAX_RESULTS", "get_store", "tokenize"]

"""WebShop (Yao et al., 2022) as a text environment, in the spirit of its "simple" text mode.

One module per responsibility: :mod:`.data` (the bundled catalog and the real WebShop files), :mod:`.search` (BM25
over a data source's products, cached per process), :mod:`.scoring` (the purchase score) and :mod:`.env` (pages,
actions and the episode: :class:`WebShopEnv`).

The GiGPO paper's version (its goals, reward, pages, actions and search, as its code runs them) is
:class:`gigpo_trl.envs.verl_agent.webshop.PaperWebShopEnv` (``make_env("webshop", protocol="verl-agent")``).
"""

from .data import BUNDLED_DIR, goal_spec, load_bundled, load_webshop_dir
from .env import PROMPT_TEMPLATE, RESULTS_PER_PAGE, SEARCH_PLACEHOLDER, SUCCESS_REWARD, SYSTEM_PROMPT, WebShopEnv
from .scoring import attribute_matched, normalize, type_factor, webshop_score
from .search import MAX_RESULTS, get_store, tokenize

__all__ = ["BUNDLED_DIR", "MAX_RESULTS", "PROMPT_TEMPLATE", "RESULTS_PER_PAGE", "SEARCH_PLACEHOLDER", "SUCCESS_REWARD",
           "SYSTEM_PROMPT", "WebShopEnv", "attribute_matched", "get_store", "goal_spec", "load_bundled",
           "load_webshop_dir", "normalize", "tokenize", "type_factor", "webshop_score"]

"""gigpo_trl/models.py: the Hub id of a model path. A model path that is neither a folder nor a Hub id:
tests/test_bad_input.py; the tiny models and tokenizer are built in tests/conftest.py."""

from gigpo_trl.models import CACHE_NAME, DEFAULT_MODEL_HUB_ID, hub_model_id


def test_hub_model_id_of_default_hub_and_local_models(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("GIGPO_CACHE", str(tmp_path))
    assert DEFAULT_MODEL_HUB_ID == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_model_id(None) == hub_model_id("default") == DEFAULT_MODEL_HUB_ID
    assert hub_model_id("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert hub_model_id(tiny_model_dir) is None  # a local folder of unknown origin
    (tmp_path / CACHE_NAME).mkdir()
    assert hub_model_id(str(tmp_path / CACHE_NAME)) == DEFAULT_MODEL_HUB_ID  # the default model's conversion

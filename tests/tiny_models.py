"""Tiny random models and an offline-trained tokenizer for the tests and the CPU benchmarks (no Hub access)."""

from __future__ import annotations

from collections.abc import Iterable

from gigpo_trl.models import CHATML_TEMPLATE


def build_tiny_tokenizer(corpus: Iterable[str], vocab_size: int = 400):
    """A byte-level BPE tokenizer trained offline on ``corpus``, with ChatML special tokens and template.

    Returns a ``PreTrainedTokenizerFast`` (pad = ``<|endoftext|>``, eos = ``<|im_end|>``, left padding).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>", bos_token=None,
        padding_side="left",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(tokenizer, hidden_size: int = 32, num_layers: int = 2, seed: int = 0, max_positions: int = 4096):
    """A randomly initialised 2-layer Qwen2 causal LM sized for ``tokenizer`` (≈50k parameters at hidden 32)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model

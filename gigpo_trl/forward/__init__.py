"""Every forward over training rows: the loss's forwards in token-budget micro-batches, the no-grad old / reference
scoring passes, shared prompt prefixes, trajectory chains, positions from the attention mask, gradient accumulation
across sub-batches, host memory returned between decoder layers, and the memory estimate behind the budget warning.

Modules and their public names (import them from the module; this package imports nothing eagerly):

- :mod:`~gigpo_trl.forward.mixin`: :class:`ForwardMixin` (the trainer's ``compute_loss`` and
  ``_get_per_token_logps_and_entropies``), :func:`forward_kind` (chains / shared prefix / plain: the one choice),
  :func:`max_over_ranks`;
- :mod:`~gigpo_trl.forward.layout`: TRL's forward-input layout (padding stripped, lengths, costs):
  :func:`rows_of_batch`, :func:`prompts_from_batch`, :func:`row_lengths`, :func:`forward_input`,
  :func:`common_prefix_length`, :func:`padded`, :func:`forward_tokens` (the one padded-token cost); the planners'
  exact token keys: :class:`TokenKeys`, :func:`token_key`, :func:`as_keys`, :func:`key_tokens`,
  :func:`key_common_prefix`, :class:`BatchRows` and :func:`batch_rows` (a micro-batch's rows read once);
- :mod:`~gigpo_trl.forward.packing`: the token-budget packer: :func:`pack_rows`, :func:`pack_rows_shared`,
  :func:`pack_rows_chained`, :func:`pack_for_forward`, :func:`scoring_sub_batches`, :func:`take_rows`,
  :func:`sub_batch_widths`, :func:`drop_filler_rows`;
- :mod:`~gigpo_trl.forward.prefix`: the shared-prefix forward: :class:`PrefixPlan`, :func:`plan_prefix_groups`,
  :func:`shared_prefix_logps`, :func:`shared_prefix_forward`, :func:`shared_prefix_hidden`, :func:`unsupported_reason`;
- :mod:`~gigpo_trl.forward.chains`: trajectory chains: :class:`ChainPlan`, :class:`ChainBatch`, :func:`plan_chains`,
  :func:`plan_unit_prefixes`, :func:`chain_batch`, :func:`chain_logps`, :func:`unique_tokens`;
- :mod:`~gigpo_trl.forward.positions`: :func:`positions_from_mask`, :func:`install_mask_positions`;
- :mod:`~gigpo_trl.forward.grad_accumulation`: :class:`Fp32GradAccumulator`, :class:`DeepSpeedStepGuard`,
  :func:`is_on_policy_micro_step`;
- :mod:`~gigpo_trl.forward.host_memory`: :func:`release_freed_host_memory`, :func:`trim_around_decoder_layers`;
- :mod:`~gigpo_trl.forward.memory`: :func:`activation_bytes_per_token`, :func:`model_activation_bytes_per_token`,
  :func:`available_memory_bytes`, :func:`budget_memory_warning`, :func:`warn_if_budget_exceeds_memory`.
"""

"""The GiGPO paper's protocol (``protocol="verl-agent"``) as its own environment classes.

The paper's numbers come from its code, langfengQ/verl-agent. These classes reproduce what that code does around the
environments, rule for rule (our own code; ``docs/paper_protocol.md`` maps each rule to its source and lists the
deviations by design):

- :mod:`.projection`: the completion -> (action, validity) projection (``parse_completion``);
- :mod:`.prompts`: the one-user-message prompt layout and its history block (``build_messages``);
- :mod:`.base`: :class:`~.base.PaperProtocol`, the mixin that gives an environment both hooks;
- :mod:`.alfworld`, :mod:`.sokoban`, :mod:`.webshop` (with the WebShop engine pages of :mod:`.webshop_engine`):
  the environments, each with the paper's evaluation draw (``paper_eval_tasks``).

Choose them by name with ``make_env(name, protocol="verl-agent")`` (:mod:`gigpo_trl.envs.registry`) or ``--protocol
verl-agent`` in the job. Nothing is imported here, so ``import gigpo_trl.envs.verl_agent.projection`` stays light.
"""

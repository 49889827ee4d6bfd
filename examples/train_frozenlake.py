"""Train an LLM agent on procedural FrozenLake maps with GiGPO (the fast, revisit-heavy environment).

    accelerate launch examples/train_frozenlake.py
    accelerate launch examples/train_frozenlake.py --step_advantage_weight 0     # the GRPO baseline
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main("frozenlake")

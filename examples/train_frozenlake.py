"""Train an LLM agent on procedural FrozenLake maps with GiGPO (the fast, revisit-heavy environment).

    accelerate launch examples/train_frozenlake.py
    accelerate launch examples/train_frozenlake.py --step_advantage_weight 0   # the GRPO baseline
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main(
        job_defaults={"env": "frozenlake"},
        training_defaults={
            "output_dir": "outputs/gigpo-frozenlake",
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "steps_per_generation": 1,
            "max_steps": 3,
            "max_turns": 6,
            "history_length": 2,
            "max_completion_length": 48,
            "learning_rate": 1e-4,
            "beta": 0.0,
            "eval_max_tasks": 8,
        },
    )

"""Train an LLM household agent on ALFWorld with GiGPO (needs `pip install gigpo_trl[alfworld]`).

    accelerate launch examples/train_alfworld.py                     # default model, bundled offline games
    ALFWORLD_DATA=/path/to/alfworld accelerate launch examples/train_alfworld.py --config configs/alfworld_gpu.yaml

Defaults are CPU-sized (a few iterations, short episodes); `configs/alfworld_gpu.yaml` holds the paper's settings.
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main(
        job_defaults={"env": "alfworld"},
        training_defaults={
            "output_dir": "outputs/gigpo-alfworld",
            "num_generations": 2,
            # 4 trajectories (2 task groups x 2 rollouts) per iteration, trained in 4 micro-batches with one
            # optimizer step: bounds activation memory of ~1,000-token WebShop prompts on a CPU.
            "per_device_train_batch_size": 1,
            "steps_per_generation": 4,
            "gradient_accumulation_steps": 4,
            "max_steps": 2,
            "max_turns": 4,
            "history_length": 1,
            "max_completion_length": 48,
            "learning_rate": 1e-4,
            "beta": 0.0,
            "eval_max_tasks": 4,
        },
    )

"""Train an LLM agent on procedural Sokoban (6×6, one box) with GiGPO.

    accelerate launch examples/train_sokoban.py
    accelerate launch examples/train_sokoban.py --config configs/sokoban_gpu.yaml --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main(
        job_defaults={"env": "sokoban"},
        training_defaults={
            "output_dir": "outputs/gigpo-sokoban",
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

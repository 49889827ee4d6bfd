"""Train an LLM shopping agent on WebShop with GiGPO.

    accelerate launch examples/train_webshop.py                      # default model, bundled catalog, CPU-sized
    accelerate launch examples/train_webshop.py --config configs/webshop_gpu.yaml --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct
    python examples/train_webshop.py --data_dir /path/to/webshop/data   # official WebShop files

Defaults finish on a 2-core CPU in about 10 minutes (a few iterations, small groups, short episodes); they show
the path end to end, not a trained agent. `configs/webshop_gpu.yaml` holds the paper-scale settings.
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main(
        job_defaults={"env": "webshop"},
        training_defaults={
            "output_dir": "outputs/gigpo-webshop",
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

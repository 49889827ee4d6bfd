"""Train an LLM shopping agent on WebShop with GiGPO.

    accelerate launch examples/train_webshop.py                                  # default model, bundled catalog
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml examples/train_webshop.py \
        --config configs/webshop_gpu.yaml                                        # paper scale
    accelerate launch examples/train_webshop.py --data_dir /path/to/webshop/data # official WebShop files

The defaults (gigpo_trl.job.EXAMPLE_DEFAULTS) are smoke-sized for a CPU (benchmarks/experiments/warmup.md gives the measured time);
without CUDA they also bound memory (gigpo_trl.job.CPU_DEFAULTS: gradient checkpointing, max_tokens_per_microbatch
1024; the run peaked at 2.73 GB, and `--max_tokens_per_microbatch N` moves it by ~1.3 MB per token: docs/memory.md);
every GiGPOConfig field can be overridden on the command line (`--max_steps 10`) or in a `--config` YAML file
(`--help` lists the job's and GiGPO's flags first). A mistake ends the job with one `[gigpo] error: ...` line and
exit code 2 (`GIGPO_DEBUG=1` shows the traceback); an `--output_dir` holding an earlier run is refused unless
`--overwrite_output_dir true`.
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main("webshop")

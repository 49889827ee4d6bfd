"""Train an LLM shopping agent on WebShop with GiGPO.

    accelerate launch examples/train_webshop.py                                  # default model, bundled catalog
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml examples/train_webshop.py \
        --config configs/webshop_gpu.yaml                                        # paper scale
    accelerate launch examples/train_webshop.py --data_dir /path/to/webshop/data # official WebShop files

The defaults (gigpo_trl.job.EXAMPLE_DEFAULTS) finish on a 2-core CPU in about 10 minutes; every GiGPOConfig field
can be overridden on the command line (`--max_steps 10`) or in a `--config` YAML file.
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main("webshop")

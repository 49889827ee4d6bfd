"""Train an LLM household agent on ALFWorld with GiGPO (needs `pip install -e ".[alfworld]"`).

    accelerate launch examples/train_alfworld.py                                 # default model, bundled games
    ALFWORLD_DATA=/path/to/alfworld accelerate launch --config_file configs/accelerate/multi_gpu.yaml \
        examples/train_alfworld.py --config configs/alfworld_gpu.yaml            # official data, paper scale
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main("alfworld")

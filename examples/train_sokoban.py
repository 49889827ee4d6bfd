"""Train an LLM agent on procedural Sokoban (6×6, one box) with GiGPO.

    accelerate launch examples/train_sokoban.py
    accelerate launch examples/train_sokoban.py --config configs/sokoban_gpu.yaml
"""

from gigpo_trl.job import main

if __name__ == "__main__":
    main("sokoban")

"""``python -m memorywalker ...``: the CLI, for launchers that take a module
(``torchrun --nproc-per-node 2 -m memorywalker rl ...``, ``accelerate launch -m memorywalker sft ...``)."""

from memorywalker.cli.main import main

if __name__ == "__main__":
    main()

"""Training: typed configs, checkpoints, metrics logging, data parallelism (used by the recipes)."""

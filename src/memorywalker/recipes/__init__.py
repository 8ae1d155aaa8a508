"""Training recipes: one readable file each (sft, rl)."""

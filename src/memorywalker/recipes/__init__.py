"""Training recipes: one readable file each (sft, rl, dpo, dagger) and the demo pipeline (demo)."""

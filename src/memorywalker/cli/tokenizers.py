"""The tokenizer a command reads with: the ``--tokenizer`` directory given, or the offline kit's."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(tokenizer_dir: Path | str | None):
    """The Hugging Face tokenizer at ``tokenizer_dir``; the kit's (``memorywalker.modelkit``) when None."""
    from transformers import AutoTokenizer  # lazy: transformers (~1 s), only when a command runs

    if tokenizer_dir is None:
        from memorywalker.modelkit import default_kit  # lazy: the kit's machinery, only when it is wanted

        tokenizer_dir, _ = default_kit()
    return AutoTokenizer.from_pretrained(tokenizer_dir)

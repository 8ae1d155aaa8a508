"""The tokenizer a command reads with: the ``--tokenizer`` directory given, or the offline kit's."""

from __future__ import annotations

from pathlib import Path

from memorywalker.errors import judging


def load_tokenizer(tokenizer_dir: Path | str | None):
    """The Hugging Face tokenizer at ``tokenizer_dir``; the kit's when None. A directory that holds no
    tokenizer is bad input (an InputError naming it), as for the recipes."""
    from transformers import AutoTokenizer  # lazy: transformers (~1 s), only when a command runs

    from memorywalker.train.model import TOKENIZER  # lazy: the command's machinery (torch), only when it runs

    if tokenizer_dir is None:
        from memorywalker.modelkit import default_kit  # lazy: as above

        tokenizer_dir, _ = default_kit()
    with judging(tokenizer_dir, TOKENIZER):
        return AutoTokenizer.from_pretrained(tokenizer_dir)

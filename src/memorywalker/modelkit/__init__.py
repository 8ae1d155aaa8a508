"""The offline model kit: a tiny tokenizer with a chat template and tiny random causal LMs."""

from memorywalker.modelkit.build import ARCHS, build_model, build_tokenizer, bundled_corpus, default_kit
from memorywalker.modelkit.templates import TEMPLATES

__all__ = ["ARCHS", "TEMPLATES", "build_model", "build_tokenizer", "bundled_corpus", "default_kit"]

"""memorywalker: train LLM agents on the contexts they actually saw."""

__version__ = "0.1.0"

"""``memorywalker export``: per-call examples (TRL, OpenAI, Parquet) and per-trajectory tree records."""

from memorywalker.export.formats import (
    FORMATS,
    examples,
    openai_examples,
    openai_message,
    parquet_rows,
    trajectory_record,
    trl_examples,
    trl_row_from_parquet,
    write_parquet,
)

__all__ = ["FORMATS", "examples", "openai_examples", "openai_message", "parquet_rows", "trajectory_record",
           "trl_examples", "trl_row_from_parquet", "write_parquet"]

"""Trajectory records: schema v1, validation with reason codes, streaming JSONL I/O, the builder, and
black-box context reconstruction (``blackbox.py``: a trajectory from delivered contexts alone)."""

from memorywalker.records.builder import TrajectoryBuilder
from memorywalker.records.derive import derive
from memorywalker.records.io import (
    ReadSummary,
    TrajectoryReader,
    TrajectoryWriter,
    parse_line,
    read_trajectories,
    write_trajectories,
)
from memorywalker.records.limits import RecordLimits
from memorywalker.records.schema import (
    SCHEMA_VERSION,
    Call,
    Eviction,
    Lineage,
    Message,
    Task,
    ToolCall,
    ToolSchema,
    Trajectory,
    json_schema,
)
from memorywalker.records.validate import REASONS, RecordError, Reject, check_trajectory

__all__ = [
    "derive",
    "REASONS",
    "SCHEMA_VERSION",
    "Call",
    "Eviction",
    "Lineage",
    "Message",
    "ReadSummary",
    "RecordError",
    "RecordLimits",
    "Reject",
    "Task",
    "ToolCall",
    "ToolSchema",
    "Trajectory",
    "TrajectoryBuilder",
    "TrajectoryReader",
    "TrajectoryWriter",
    "check_trajectory",
    "json_schema",
    "parse_line",
    "read_trajectories",
    "write_trajectories",
]

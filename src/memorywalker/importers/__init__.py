"""Importers: real harness logs → trajectory schema v1 records with the contexts each call received.

>>> from memorywalker.importers import get_importer          # doctest: +SKIP
>>> result = run_import("claude-code", [Path("session.jsonl")])  # doctest: +SKIP
>>> result.counts()["calls"]                                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memorywalker.errors import InputError
from memorywalker.importers import (
    claude_code,
    cline,
    codex,
    gemini_cli,
    hf_traces,
    mini_swe_agent,
    openai_chat,
    opencode,
    openhands,
    pi,
    qwen_agent,
    roo_code,
    swe_agent,
)
from memorywalker.importers.base import IMPORT_REASONS, ImportOptions, ImportReject, ImportResult
from memorywalker.importers.redact import Redactor, redact_import

Importer = Callable[[list[Path], ImportOptions], ImportResult]

IMPORTERS: dict[str, Importer] = {
    "claude-code": claude_code.import_paths,
    "cline": cline.import_paths,
    "codex": codex.import_paths,
    "gemini-cli": gemini_cli.import_paths,
    "hf-traces": hf_traces.import_paths,
    "mini-swe-agent": mini_swe_agent.import_paths,
    "openai-chat": openai_chat.import_paths,
    "opencode": opencode.import_paths,
    "openhands": openhands.import_paths,
    "pi": pi.import_paths,
    "qwen-agent": qwen_agent.import_paths,
    "roo-code": roo_code.import_paths,
    "swe-agent": swe_agent.import_paths,
}


def get_importer(name: str) -> Importer:
    try:
        return IMPORTERS[name]
    except KeyError:
        raise InputError(f"unknown import format {name!r}; valid formats: {', '.join(sorted(IMPORTERS))}") from None


def run_import(name: str, paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    """Import ``paths`` with the importer ``name``; redact every trajectory and reject when asked."""
    options = options or ImportOptions()
    result = get_importer(name)([Path(p) for p in paths], options)
    if options.redact:  # detect over every trajectory and reject first, then replace everywhere
        redactor = redact_import(result)
        result.notes.update({f"redacted:{k}": v for k, v in redactor.counts.items()})
    return result


__all__ = ["IMPORTERS", "IMPORT_REASONS", "ImportOptions", "ImportReject", "ImportResult", "Redactor",
           "get_importer", "run_import"]

"""Shared pieces of the importers: the result/reject bookkeeping, JSONL reading, field readers. The
black-box reconstruction they share (message identity by content, inferred evictions) is the records
layer's: :mod:`memorywalker.records.blackbox`.

Every importer returns an :class:`ImportResult`. Input records are counted once each, so
``read == imported + skipped + rejected`` always holds: *imported* records contributed to a
trajectory, *skipped* ones are known record kinds that never reach the model (progress events, UI
snapshots, ...), *rejected* ones carry a reason code from :data:`IMPORT_REASONS`.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memorywalker.records import RecordError, Trajectory, TrajectoryBuilder
from memorywalker.records.limits import RecordLimits, check_size, loads
from memorywalker.records.validate import REASONS, SHARED_REASONS
from memorywalker.render.toolcalls import arguments_from_text

IMPORT_REASONS: dict[str, str] = {
    **{code: REASONS[code] for code in SHARED_REASONS},  # bad_json, too_deep, ...: one meaning, the records'
    "unreadable_file": "the file could not be opened or decoded",
    "bad_format": "the file does not have the structure this format expects",
    "unknown_record_type": "a record type this importer does not know; it is not sent to the model",
    "missing_parent": "a record's parent is not in the input: contexts behind it are incomplete",
    "parent_cycle": "a record's parent links loop: the context behind it is cut where the loop closes",
    "orphan_tool_result": "a tool result answers no tool call of its context; it was left out",
    # A warning (kept): a subagent transcript imported without its session file.
    "orphan_subagent": "a subagent transcript whose session file is absent; imported on its own, not linked to its spawning call",
    # A built trajectory failed check_trajectory: the reason is "invalid_trajectory:<code>".
    "invalid_trajectory": "the reconstructed trajectory violates schema v1",
}


@dataclass(frozen=True)
class ImportReject:
    source: str
    line: int | None  # 1-based line (JSONL) or record index; None for a whole file/trajectory
    reason: str
    message: str
    kept: bool = False  # the record itself was still used (e.g. missing_parent: its context is cut)
    detail: str | None = None  # what the record carried (unknown types), abridged: see ``carried``

    def as_dict(self) -> dict[str, Any]:
        out = {"source": self.source, "line": self.line, "reason": self.reason, "message": self.message,
               "kept": self.kept}
        if self.detail is not None:
            out["detail"] = self.detail
        return out


@dataclass
class ImportResult:
    trajectories: list[Trajectory] = field(default_factory=list)
    rejects: list[ImportReject] = field(default_factory=list)
    read: int = 0
    imported: int = 0
    skipped: Counter = field(default_factory=Counter)  # kind -> records deliberately not used
    notes: Counter = field(default_factory=Counter)  # handled-and-counted events (thinking blocks, ...)

    @property
    def rejected(self) -> int:
        """Records rejected (file- and trajectory-level rejects and kept records do not count)."""
        return sum(1 for r in self.rejects if r.line is not None and not r.kept)

    def reject(self, source: str | Path, line: int | None, reason: str, message: str, kept: bool = False,
               detail: str | None = None) -> None:
        assert reason.split(":")[0] in IMPORT_REASONS, reason
        self.rejects.append(ImportReject(str(source), line, reason, message, kept, detail))

    def add(self, other: ImportResult) -> None:
        self.trajectories += other.trajectories
        self.rejects += other.rejects
        self.read += other.read
        self.imported += other.imported
        self.skipped.update(other.skipped)
        self.notes.update(other.notes)

    def finish(self, builder: TrajectoryBuilder, source: str | Path) -> Trajectory | None:
        """Build and check ``builder``; keep the trajectory or reject it with its reason code."""
        if not builder.calls:
            self.reject(source, None, "no_calls", f"trajectory {builder.id!r} has no model call")
            return None
        if "system_prompt" not in builder.meta:  # per record: were the contexts imported with the system prompt?
            roles = {m.id: m.role for m in builder.messages}
            sent = any(roles.get(i) == "system" for c in builder.calls if c.purpose != "summarize" for i in c.context)
            builder.meta["system_prompt"] = "recorded" if sent else "absent"
        try:
            traj = builder.build()
        except RecordError as e:
            self.reject(source, None, f"invalid_trajectory:{e.code}", f"{builder.id}: {e.message}")
            return None
        self.trajectories.append(traj)
        return traj

    def counts(self) -> dict[str, Any]:
        evs = [ev for t in self.trajectories for ev in t.evictions]
        evictions = Counter(ev.kind for ev in evs)
        calls = [c for t in self.trajectories for c in t.calls]
        return {
            "read": self.read,
            "imported": self.imported,
            "skipped": sum(self.skipped.values()),
            "rejected": self.rejected,
            "trajectories": len(self.trajectories),
            "calls": len(calls),
            # selected + the unselected by reason code = calls; ``context_unverified`` is the training
            # data the billed-token check removed (importers/billed.py).
            "calls_selected": sum(c.selected for c in calls),
            "unselected_by_reason": dict(sorted(Counter((c.reason or "no_reason").split(":")[0]
                                                        for c in calls if not c.selected).items())),
            "evictions": dict(sorted(evictions.items())),
            # trajectories whose act calls hold no system message: the log did not keep the one that was sent
            "system_prompt_absent": sum(t.meta.get("system_prompt") == "absent" for t in self.trajectories),
            # not recorded by the harness: derived from the delivered contexts (swe-agent, qwen-agent, ...)
            # or from a billed-token drop (those carry ``meta.evidence``); the rest are white-box records
            "evictions_inferred": sum(bool(ev.meta.get("inferred")) for ev in evs),
            "evictions_from_billed_drops": sum(bool(ev.meta.get("inferred")) and "evidence" in ev.meta for ev in evs),
            # Record rejects (they add up to ``rejected``); whole files or trajectories dropped; records
            # kept with a warning (a cut context). Each list adds up on its own.
            "rejects_by_reason": dict(sorted(Counter(r.reason for r in self.rejects
                                                     if r.line is not None and not r.kept).items())),
            "dropped_by_reason": dict(sorted(Counter(r.reason for r in self.rejects
                                                     if r.line is None and not r.kept).items())),
            "warnings_by_reason": dict(sorted(Counter(r.reason for r in self.rejects if r.kept).items())),
            "skipped_by_kind": dict(sorted(self.skipped.items())),
            "notes": dict(sorted(self.notes.items())),
        }


@dataclass
class ImportOptions:
    redact: bool = False
    max_input_tokens: int | None = None  # qwen-agent: the budget its truncation was run with
    count_tokens: Any = None  # qwen-agent: callable(str) -> int; default len(text.encode()) // 4
    tools: Any = None  # codex: the tool set the harness offered (importers.tools.ToolSet), when the log lacks it


def files_under(paths: list[Path], pattern: str = "*.jsonl") -> Iterator[Path]:
    """Each input file, or the files matching ``pattern`` anywhere under an input folder (sorted)."""
    for path in paths:
        yield from sorted(path.rglob(pattern)) if path.is_dir() else [path]


def import_files(files: Iterable[Path], import_file: Callable[[Path, ImportResult], object]) -> ImportResult:
    """One result for ``import_file(f, result)`` over each of ``files`` (an importer's ``import_paths``)."""
    result = ImportResult()
    for f in files:
        import_file(f, result)
    return result


def read_jsonl(path: Path, result: ImportResult,
               check: Callable[[dict], str | None] | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, object)`` for every good line; reject the others (counted as read), among
    them lines over the size or depth limit (:mod:`memorywalker.records.limits`): one such line never
    stops the file, let alone the import. ``check`` names the first key field of a line that is not a
    scalar (default :func:`wrong_key_field`; a format that knows which fields it reads passes its own)."""
    check = check or wrong_key_field
    limits = RecordLimits.from_env()
    try:
        data = path.read_bytes()
    except OSError as e:
        result.reject(path, None, "unreadable_file", str(e))
        return
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        result.read += 1
        try:
            check_size(len(raw), limits)
            obj = loads(raw.decode("utf-8"), limits)
        except RecordError as e:
            result.reject(path, i, e.code, f"line {i}: {e.message}")
            continue
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            final = i - 1 == last  # no newline after it
            result.reject(path, i, "truncated_line" if final else "bad_json", f"line {i}: {e}")
            continue
        if not isinstance(obj, dict):
            result.reject(path, i, "not_an_object", f"line {i}: got a JSON {type(obj).__name__}")
            continue
        bad = check(obj)
        if bad is not None:
            result.reject(path, i, "wrong_type", f"line {i}: {bad} is not text", detail=carried(obj))
            continue
        yield i, obj


def read_json(path: Path, result: ImportResult) -> Any:
    """A whole-file JSON document, or None (rejected as unreadable / bad / truncated / too deep). Only
    the depth limit applies: a whole-file trajectory (SWE-agent) may legitimately be large."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        result.reject(path, None, "unreadable_file", str(e))
        return None
    try:
        return loads_deep_limited(text)
    except RecordError as e:
        result.reject(path, None, e.code, f"{path.name}: {e.message}")
        return None
    except json.JSONDecodeError as e:  # cut short: the parser ran out at the end, or inside a string that never closes
        cut = e.pos >= len(text.rstrip()) - 1 or e.msg.startswith("Unterminated string")
        reason = "truncated_line" if cut else "bad_json"
        result.reject(path, None, reason, f"{path.name}: {e}")
        return None


def loads_deep_limited(text: str | bytes) -> Any:
    """``json.loads`` with the depth limit only; a :class:`~memorywalker.records.RecordError`
    (``too_deep``) for hostile nesting instead of a ``RecursionError``."""
    limits = RecordLimits.from_env()
    return loads(text, dataclasses.replace(limits, max_bytes=len(text)))


def carried(obj: Any, limit: int = 600) -> str:
    """What an unknown record carried, as compact JSON cut to ``limit`` characters (``--debug`` shows it).

    >>> carried({"type": "x", "text": "a" * 10}, limit=24)
    '{"type":"x","text":"aaaa… (32 chars)'
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


# Fields that name, type or link records in the formats read here: they must be scalars.
KEY_FIELDS = frozenset({
    "type", "role", "id", "uuid", "parentUuid", "parentId", "parentID", "logicalParentUuid", "subtype", "sessionId",
    "sessionID", "messageID", "requestId", "tool_use_id", "tool_call_id", "call_id", "callID", "toolCallId",
    "toolUseId", "name", "tool", "toolName", "function_name", "model", "modelID", "providerID", "provider", "api",
    "condenseId", "condenseParent", "truncationId", "truncationParent", "firstKeptEntryId", "tail_start_id",
    "stopReason", "stop_reason", "status", "source", "action", "observation", "say", "ask", "$rewindTo",
    "anchorUuid", "headUuid", "tailUuid", "agentId", "customType", "fromId", "targetId", "reminderType",
})


# Free-form payloads (tool inputs and outputs, provider metadata): their fields are data, not links.
FREE_FORM = frozenset({"input", "arguments", "args", "toolUseResult", "extras", "output", "response", "result",
                       "metadata", "details", "data", "parameters", "schema", "snapshot", "providerMetadata",
                       "callProviderMetadata", "usage", "tokens", "cost", "raw",
                       # a tool's JSON schema (Claude Code's api-request-shape); usage keyed by model name
                       "input_schema", "modelUsage"})


def wrong_key_field(obj: Any, depth: int = 0) -> str | None:
    """The path of the first field of :data:`KEY_FIELDS` whose value is a list or an object, or None
    (free-form payloads, :data:`FREE_FORM`, are not looked into).

    >>> wrong_key_field({"type": "user", "message": {"role": ["user"]}})
    'message.role'
    """
    if depth > 16:
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        if isinstance(v, dict | list):
            if isinstance(k, str) and k in KEY_FIELDS:
                return k
            if isinstance(k, str) and k in FREE_FORM:
                continue
            inner = wrong_key_field(v, depth + 1)
            if inner is not None:
                return f"{k}.{inner}"
    return None


def role_message(result: ImportResult, path: Path, index: int, msg: Any, roles: tuple[str, ...], *,
                 noun: str = "message", expected: str) -> bool:
    """Count ``msg`` (item ``index`` of ``path``) as read, and as imported when it is an object whose
    ``role`` is one of ``roles`` with scalar key fields; otherwise reject it: "``noun`` #i is not
    ``expected``"."""
    result.read += 1
    if not isinstance(msg, dict) or wrong_key_field(msg) is not None or msg.get("role") not in roles:
        result.reject(path, index, "bad_format" if isinstance(msg, dict) else "not_an_object",
                      f"{noun} #{index} is not {expected}", detail=carried(msg))
        return False
    result.imported += 1
    return True


def as_text(x: Any) -> str:
    """A field that should be text: itself, "" for a missing one, else its JSON."""
    return x if isinstance(x, str) else "" if x is None else json.dumps(x, ensure_ascii=False, default=str)


def opt_str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def opt_int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def as_list(x: Any) -> list:
    """A field that should be a list: itself, else empty."""
    return x if isinstance(x, list) else []


def str_list(x: Any) -> list[str]:
    """A field that should be a list of strings: its strings (anything else dropped)."""
    return [v for v in x if isinstance(v, str)] if isinstance(x, list) else []


def content_text(content: Any) -> str:
    """Plain text of a message content: a string or a list of typed parts (OpenAI/Anthropic/Qwen)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if text is None and part.get("type") in ("image", "image_url", "input_image"):
                    text = "[image]"
                out.append(text if isinstance(text, str) else "" if text is None else json.dumps(text, default=str))
            else:
                out.append(json.dumps(part, default=str))
        return "\n\n".join(out)
    return json.dumps(content, ensure_ascii=False)


def parse_arguments(args: Any) -> dict | str:
    """Tool-call arguments as a dict; the raw string when it is not a JSON object."""
    if isinstance(args, dict):
        return args
    if isinstance(args, str):  # not JSON, or hostile nesting (a RecordError): kept as the raw string
        return arguments_from_text(args, loads_deep_limited)
    return {} if args is None else str(args)

"""Claude Code session logs (``~/.claude/projects/<project>/<session>.jsonl``) → trajectories.

* **Calls.** One call per model response. Claude Code writes one record per content block, so the
  records sharing ``message.id`` (or ``requestId``) are one response; their text, thinking and
  tool_use blocks are merged into one assistant message.
* **Contexts from the request log** (2.1.3xx): when the response's ``requestRef`` names an
  ``api-request`` whose chain resolves, its context is that request's exact messages, system prompt
  and tools, and its ``requestDigest`` is recomputed (:mod:`.requests`); otherwise:
* **Contexts.** The context of a call is the ``parentUuid`` chain the model saw, walked back from
  the response's first record to the newest ``compact_boundary`` (whose ``parentUuid`` is null).
  Parallel tool uses branch that chain (each result hangs off its own tool_use record), so the
  results of every tool_use of an assistant message are placed right after it, as the API
  requires, whatever branch they were written on.
* **Compaction.** Each ``compact_boundary`` is a white-box ``summarize`` eviction before the first
  call after it: ``trigger`` and ``preTokens`` kept, removed = the pre-compaction chain (found
  through ``logicalParentUuid``), inserted = the ``isCompactSummary`` message (author ``harness``).
  The summarization call in ``subagents/agent-acompact-*.jsonl`` is a call whose context is the
  pre-compaction chain plus its own prompt.
* **Partial compaction** (2.1.x): a boundary whose ``compactMetadata`` carries ``preservedMessages``
  (``anchorUuid``, ``uuids``) or ``preservedSegment`` (``headUuid``, ``anchorUuid``, ``tailUuid``) kept
  those messages after the summary. Calls after the boundary walk the chain as Claude Code relinks it
  on load (head → anchor, the anchor's other children → tail); calls whose response is a preserved
  message keep the pre-compaction chain they were sampled in.
* **Micro-compaction.** A ``microcompact_boundary`` clears the tool results it lists
  (``compactedToolIds``) for every call that descends from it: each is sent as
  "[Old tool result content cleared]" (a ``prune`` eviction inserting that placeholder); one that
  lists nothing is found by the billed-token check (:mod:`.micro`, :mod:`memorywalker.importers.billed`).
* **Attachments.** ``type: "attachment"`` records become the messages Claude Code sends for them
  (see :mod:`.attachments`).
* **Billed tokens.** Each call's ``message.usage`` prompt (input + cache creation + cache read) is
  checked against the call before it in its segment: a drop no eviction explains is an inferred
  eviction and leaves the calls it touches unselected (``context_unverified``).
* **Subagents.** ``subagents/agent-<id>.jsonl`` (Task tool) and, in older versions, ``isSidechain``
  chains inside the session file become their own trajectories linked by lineage.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from memorywalker.importers.base import ImportOptions, ImportResult, as_list, content_text
from memorywalker.importers.claude_code.records import (
    CLEARED,
    Index,
    Rec,
    index_request_messages,
    read_file,
    reject_orphan_results,
    resolve_compactions,
    root_of,
)
from memorywalker.importers.claude_code.trajectory import ChainTrajectory
from memorywalker.records import Lineage

FORMAT = "claude-code"
__all__ = ["CLEARED", "FORMAT", "import_paths", "import_session", "import_orphan_subagent"]


def import_paths(paths: list[Path], options: ImportOptions | None = None) -> ImportResult:
    result = ImportResult()
    for path in paths:
        if path.is_dir():
            files = sorted(path.glob("*.jsonl"))
            # Subagent transcripts whose session file is not there are imported on their own.
            orphans = sorted(f for f in path.glob("*/subagents/agent-*.jsonl")
                             if not (path / f"{f.parent.parent.name}.jsonl").exists())
            if path.name == "subagents":
                files, orphans = [], sorted(path.glob("agent-*.jsonl"))
        else:
            files, orphans = ([], [path]) if path.parent.name == "subagents" else ([path], [])
        for f in files:
            result.add(import_session(f))
        for f in orphans:
            result.add(import_orphan_subagent(f))
    return result


def import_orphan_subagent(path: Path) -> ImportResult:
    """A ``<session>/subagents/agent-<id>.jsonl`` imported without its session file, with a warning.

    A Task subagent's chain starts at its own prompt, so its calls are complete; only the link to the
    spawning call is unknown (``lineage.parent`` names the session, ``parent_call`` is None). A
    compaction's summarization call (``agent-acompact-*``) is rejected: its context is the session's
    pre-compaction chain, which is in the missing file.
    """
    result = ImportResult()
    index = Index()
    session_id = path.parent.parent.name
    session_file = path.parent.parent.with_suffix(".jsonl")
    why = "is not in the input" if session_file.exists() else "does not exist"
    recs, _ = read_file(path, index, result, 0)
    index_request_messages(index)
    if path.name.startswith("agent-acompact"):
        result.reject(path, None, "missing_parent", f"{path.name}: a compaction's summarization call; its "
                      f"context is in the session file {session_file.name}, which {why}")
        return result
    resolve_compactions(recs, index, result)
    reject_orphan_results({path: recs}, index, result)
    for rec in recs:
        if rec.parent and rec.parent not in index.by_uuid:
            index.missing.add(rec.uuid)
            result.reject(path, rec.line, "missing_parent",
                          f"line {rec.line}: parentUuid {rec.parent!r} is not in the input; the context behind it is cut",
                          kept=True)
    agent_id = path.stem.removeprefix("agent-")
    sub = ChainTrajectory(f"{session_id}/agent-{agent_id}", path, index, result, lineage=Lineage(
        parent=session_id, relation="subagent", source=FORMAT, source_path=str(path)))
    sub.add_calls(recs)
    if sub.finish() is not None:
        result.reject(path, None, "orphan_subagent", f"{path.name}: imported on its own; the session file "
                      f"{session_file.name} {why}, so the call that spawned it is unknown", kept=True)
        result.notes["subagents_orphan"] += 1
    return result


def import_session(path: Path) -> ImportResult:
    """One session file plus its ``<session>/subagents/*.jsonl``."""
    result = ImportResult()
    index = Index()
    main: list[Rec] = []
    order = 0
    sub_dir = path.with_suffix("") / "subagents"
    sub_files = sorted(sub_dir.glob("*.jsonl")) if sub_dir.is_dir() else []
    per_file: dict[Path, list[Rec]] = {}
    for f in [path, *sub_files]:
        per_file[f], order = read_file(f, index, result, order)
    main = per_file.get(path, [])
    index_request_messages(index)
    for recs in per_file.values():
        resolve_compactions(recs, index, result)
    reject_orphan_results(per_file, index, result)
    for f, recs in per_file.items():
        for rec in recs:
            p = rec.parent
            if p and p not in index.by_uuid:
                index.missing.add(rec.uuid)
                result.reject(f, rec.line, "missing_parent",
                              f"line {rec.line}: parentUuid {p!r} is not in the input; the context behind it is cut",
                              kept=True)

    session_id = next((r.obj["sessionId"] for r in main if isinstance(r.obj.get("sessionId"), str) and r.obj["sessionId"]),
                      path.stem)
    main_chain = [r for r in main if not r.obj.get("isSidechain")]
    trajectory = ChainTrajectory(session_id, path, index, result, lineage=Lineage(source=FORMAT, source_path=str(path)))
    for f in sub_files:
        if f.name.startswith("agent-acompact"):
            trajectory.summarization_calls(per_file[f])
    trajectory.add_calls(main_chain)
    traj = trajectory.finish()

    # Task subagents: subagents/agent-<id>.jsonl, linked through toolUseResult.agentId.
    spawned = _spawning_calls(trajectory, main_chain)
    for f in sub_files:
        if f.name.startswith("agent-acompact"):
            continue
        agent_id = f.stem.removeprefix("agent-")
        parent_call = spawned.get(agent_id)
        sub = ChainTrajectory(f"{session_id}/agent-{agent_id}", f, index, result, lineage=Lineage(
            parent=traj.id if traj else None, parent_call=parent_call, relation="subagent",
            source=FORMAT, source_path=str(f)))
        sub.add_calls(per_file[f])
        sub.finish()
        result.notes["subagents_linked" if parent_call else "subagents_unlinked"] += 1

    # Older versions keep Task subagents inline as isSidechain chains.
    side = [r for r in main if r.obj.get("isSidechain")]
    roots: dict[str, list[Rec]] = defaultdict(list)
    for rec in side:
        roots[root_of(rec, index)].append(rec)
    prompts = _task_prompts(trajectory, main_chain)
    for root, recs in roots.items():
        first_user = next((r for r in recs if r.obj.get("type") == "user"), None)
        prompt = content_text((first_user.obj.get("message") or {}).get("content")) if first_user else ""
        parent_call = prompts.get(prompt.strip())
        sub = ChainTrajectory(f"{session_id}/sidechain-{root[:8]}", path, index, result, lineage=Lineage(
            parent=traj.id if traj else None, parent_call=parent_call, relation="subagent",
            source=FORMAT, source_path=str(path)))
        sub.add_calls(recs)
        sub.finish()
        result.notes["sidechain_subagents"] += 1
    return result



def _spawning_calls(t: ChainTrajectory, recs: list[Rec]) -> dict[str, str]:
    """agentId -> id of the call whose Task tool_use the agent answered."""
    out = {}
    for rec in recs:
        tur = rec.obj.get("toolUseResult")
        if rec.obj.get("type") != "user" or not isinstance(tur, dict) or "agentId" not in tur:
            continue
        for block in as_list((rec.obj.get("message") or {}).get("content")):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                call = t.call_of_tool_use.get(block.get("tool_use_id"))
                if call:
                    out[str(tur["agentId"])] = call
    return out


def _task_prompts(t: ChainTrajectory, recs: list[Rec]) -> dict[str, str]:
    out = {}
    for rec in recs:
        if rec.obj.get("type") != "assistant":
            continue
        for block in as_list((rec.obj.get("message") or {}).get("content")):
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "Task":
                prompt = str((block.get("input") or {}).get("prompt", "")).strip()
                if prompt and block.get("id") in t.call_of_tool_use:
                    out[prompt] = t.call_of_tool_use[block["id"]]
    return out


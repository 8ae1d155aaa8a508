"""OpenCode's summary call as OpenCode 1.18 sends it (the opencode importer's ``summary_context``).

OpenCode asks for a compaction summary with no tools, its compaction agent's system prompt
(:data:`SUMMARY_SYSTEM`) and one user text (:func:`summary_prompt`): the conversation since the previous
compaction flattened one message per block (:func:`flatten`), the previous summary when there is one,
and its instructions and template. Read from the OpenCode 1.18.33 binary's ``session/compaction`` code
and matched, token for token, to what it sent through the gateway (docs/importers.md).

>>> summary_prompt(["[User]: hi"], None).splitlines()[:4]
['Here is the conversation so far:', '', '<conversation>', '[User]: hi']
"""

from __future__ import annotations

import json
from typing import Any

CLEARED = "[Old tool result content cleared]"
# Text of sst/opencode (MIT), as OpenCode 1.18.33 sent it through the gateway: the summary call's system prompt,
# and the pieces of its user text (session/compaction.ts: buildPrompt).
SUMMARY_SYSTEM = (
    "You are a context summarization agent. You are given a conversation between a user and an agent. Your goal is "
    "to produce a structured summary matching the format specified so another coding agent can continue the work."
    "\n\nAlways follow the exact output structure requested by the user prompt. Keep every section, preserve exact "
    "file paths and identifiers when known, and prefer terse bullets over paragraphs.\n\nDo not continue the "
    "conversation. Do not respond to any questions in the conversation. Only output the structured summary in the "
    "exact format requested by the user prompt. Respond in the same language as the conversation.\n")
SUMMARY_ASK = ("Create a new anchored summary from the conversation history in the <conversation> tags above so "
               "another coding agent can continue the work.")
SUMMARY_COMBINE = (
    "The <prior-summary> summarizes everything that happened before the <conversation>. Construct a new summary "
    "that combines both. The <prior-summary> is discarded after this: anything you do not carry into the new "
    "summary is lost.\n\nWhen combining:\n- Carry forward objectives, constraints, user directives, decisions, and "
    "parallel workstreams from the <prior-summary> even when the <conversation> does not mention them. Drop only "
    "what is finished and no longer needed.\n- The <conversation> is more recent than the <prior-summary>. Where "
    "they conflict, the conversation wins: state the corrected fact and drop the old claim.\n- Add new progress, "
    "decisions, constraints, and context from the conversation.\n- Move completed work from \"Active\" to "
    "\"Completed\".\n- If a blocker has been resolved, update the summary to reflect that while keeping any details "
    "still needed to continue the work.\n- Update \"Objective\" and \"Next Move\" to reflect the current work state.")
SUMMARY_TEMPLATE = (
    "Output exactly the Markdown structure shown inside <template> and keep the section order unchanged. Do not "
    "include the <template> tags in your response.\n<template>\n## Objective\n- [one or two brief sentences "
    "describing what the user is trying to accomplish]\n\n## Important Details\n- [constraints/preferences, "
    "decisions and why, important facts/assumptions, exact context needed to continue, or \"(none)\"]\n\n## Work "
    "State\n### Completed\n- [finished work, verified facts, or changes made; otherwise \"(none)\"]\n\n### Active\n"
    "- [current work, partial changes, or investigation state; otherwise \"(none)\"]\n\n### Blocked\n- [blockers, "
    "failing commands, or unknowns; otherwise \"(none)\"]\n\n## Next Move\n1. [immediate concrete action, or "
    "\"(none)\"]\n2. [next action if known, or \"(none)\"]\n\n## Relevant Files\n- [file or directory path: why it "
    "matters, or \"(none)\"]\n</template>\n\nRules:\n- Keep every section, even when empty.\n- Use terse bullets, not "
    "prose paragraphs.\n- Preserve exact file paths, symbols, commands, error strings, URLs, and identifiers when "
    "known.\n- Do not mention the summary process or that context was compacted.")
TOOL_RESULT_CHARS = 2000  # a tool result longer than this is cut (JavaScript length: UTF-16 code units)
FLATTENED_SINCE = (1, 18)  # the first OpenCode version whose summary call this importer rebuilds flattened


def _js_cut(text: str, limit: int = TOOL_RESULT_CHARS) -> str:
    """``text.length <= limit ? text : text.slice(0, limit) + "\\n[truncated]"``, counted as JavaScript does."""
    units = text.encode("utf-16-le", "surrogatepass")
    if len(units) <= 2 * limit:
        return text
    return units[:2 * limit].decode("utf-16-le", "surrogatepass") + "\n[truncated]"


def _js_json(value: Any) -> str:
    """``JSON.stringify(value)`` for parsed JSON (``undefined`` for a missing value)."""
    return "undefined" if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def flatten(mi: dict, parts: list[dict], now: float) -> str:
    """One OpenCode message as its block of the summary call's conversation ("" when it has none)."""
    if mi.get("role") == "user":
        text = "\n".join(str(p.get("text")) for p in parts
                         if p.get("type") == "text" and not p.get("ignored") and p.get("text"))
        files = [f"[Attached {p.get('mime')}: {p.get('filename') or 'file'}]" for p in parts if p.get("type") == "file"]
        return "\n".join(([f"[User]: {text}"] if text else []) + files)
    lines: list[str] = []
    for p in parts:
        kind = p.get("type")
        if kind == "text" and p.get("text"):
            lines.append(f"[Assistant]: {p['text']}")
        elif kind == "reasoning" and p.get("text"):
            lines.append(f"[Assistant reasoning]: {p['text']}")
        elif kind == "tool":
            st = p.get("state") if isinstance(p.get("state"), dict) else {}
            lines.append(f"[Assistant tool call]: {p.get('tool')}({_js_json(st.get('input'))})")
            if st.get("status") == "completed":
                pruned = (st.get("time") or {}).get("compacted") if isinstance(st.get("time"), dict) else None
                if pruned and (not now or pruned <= now):
                    lines.append(f"[Tool result]: {CLEARED}")
                else:
                    attached = [f"[Attached {a.get('mime')}: {a.get('filename') or 'file'}]"
                                for a in st.get("attachments") or [] if isinstance(a, dict)]
                    lines.append(f"[Tool result]: {_js_cut(chr(10).join([str(st.get('output', '')), *attached]))}")
            elif st.get("status") == "error":
                lines.append(f"[Tool error]: {st.get('error')}")
    return "\n".join(lines)


def summary_prompt(conversation: list[str], prior: str | None) -> str:
    """The summary call's user text: the flattened conversation, the prior summary, OpenCode's asks."""
    head = "Here is the conversation so far:\n\n<conversation>\n" + "\n\n".join(conversation) + "\n</conversation>"
    if not prior:
        return "\n\n".join([head, SUMMARY_ASK, SUMMARY_TEMPLATE])
    prior_block = ("Here is the summary of the conversation before the <conversation> above:\n\n<prior-summary>\n"
                   f"{prior}\n</prior-summary>")
    return "\n\n".join([head, prior_block, SUMMARY_COMBINE, SUMMARY_TEMPLATE])


def version(text: Any) -> tuple[int, ...] | None:
    parts = str(text or "").split(".")[:2]
    return tuple(int(x) for x in parts) if len(parts) == 2 and all(x.isdigit() for x in parts) else None

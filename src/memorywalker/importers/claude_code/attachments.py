"""Claude Code ``type: "attachment"`` records → the messages the harness sends for them.

Claude Code turns each attachment into API messages with ``normalizeAttachmentForAPI``
(``src/utils/messages.ts``): most become one ``isMeta`` user message whose text is wrapped in
``<system-reminder>\\n…\\n</system-reminder>``; a ``file`` / ``directory`` attachment becomes a
synthetic Read / Bash tool use plus its result. The texts below follow that function for the types
listed in :data:`RENDERERS`; :data:`NOT_SENT` are types it maps to no message (metadata: skipped,
counted). Any other type is unknown to this importer: its delivered text cannot be reconstructed.
:data:`INFERRED_TEXT` names the types whose wording comes from one Claude Code version (2.1.88, as
published in reconstructions of its source: ``normalizeAttachmentForAPI``, ``getAutoModeInstructions``,
``buddy/prompt.ts companionIntroText``); other versions may word them differently, so their messages
carry ``meta.inferred_text``.

>>> render({"type": "nested_memory", "content": {"path": "/p/CLAUDE.md", "content": "be terse"}})
[{'role': 'user', 'content': '<system-reminder>\\nContents of /p/CLAUDE.md:\\n\\nbe terse\\n</system-reminder>'}]
>>> render({"type": "hook_success", "hookEvent": "PostToolUse", "hookName": "fmt", "content": "ok"})
[]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from memorywalker.importers.base import as_list

# normalizeAttachmentForAPI returns [] for these: they never reach the model.
NOT_SENT = {
    "already_read_file", "command_permissions", "edited_image_file", "hook_cancelled",
    "hook_error_during_execution", "hook_non_blocking_error", "hook_system_message", "structured_output",
    "hook_permission_decision", "dynamic_skill",
    # removed types an old session may still hold
    "autocheckpointing", "background_task_status", "todo", "task_progress", "ultramemory",
}


def reminder(text: str) -> str:
    return f"<system-reminder>\n{text}\n</system-reminder>"


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": reminder(text)}]


def _tool_pair(name: str, arguments: dict, output: str) -> list[dict]:
    """A synthetic tool use and its result (Claude Code's createToolUseMessage + createToolResultMessage)."""
    return [{"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": arguments}]},
            {"role": "tool", "content": output, "name": name}]


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        return "\n".join(_text(v) for v in x)
    if isinstance(x, dict):
        return str(x.get("text") or x.get("content") or json.dumps(x, ensure_ascii=False))
    return "" if x is None else str(x)


def _file(a: dict) -> list[dict]:
    c = a.get("content")
    inner = c.get("file") if isinstance(c, dict) and isinstance(c.get("file"), dict) else c
    output = _text(inner.get("content") if isinstance(inner, dict) else inner)
    return _tool_pair("Read", {"file_path": a.get("filename", "")}, output)


def _todo(a: dict) -> list[dict]:
    items = "\n".join(f"{i + 1}. [{t.get('status')}] {t.get('content')}" for i, t in enumerate(a.get("content") or []))
    return _reminder(TODO_REMINDER, "contents of your todo list", f"[{items}]" if items else "")


def _task(a: dict) -> list[dict]:
    items = "\n".join(f"#{t.get('id')}. [{t.get('status')}] {t.get('subject')}" for t in as_list(a.get("content")))
    return _reminder(TASK_REMINDER, "tasks", items)


TODO_REMINDER = (
    "The TodoWrite tool hasn't been used recently. If you're working on tasks that would benefit from "
    "tracking progress, consider using the TodoWrite tool to track progress. Also consider cleaning up "
    "the todo list if has become stale and no longer matches what you are working on. Only use it if "
    "it's relevant to the current work. This is just a gentle reminder - ignore if not applicable. Make "
    "sure that you NEVER mention this reminder to the user\n")
TASK_REMINDER = (
    "The task tools haven't been used recently. If you're working on tasks that would benefit from "
    "tracking progress, consider using TaskCreate to add new tasks and TaskUpdate to update task status "
    "(set to in_progress when starting, completed when done). Also consider cleaning up the task list if "
    "it has become stale. Only use these if relevant to the current work. This is just a gentle reminder "
    "- ignore if not applicable. Make sure that you NEVER mention this reminder to the user\n")


def _reminder(text: str, listing: str, items: str) -> list[dict]:
    """Claude Code's reminder ``text``, followed by the existing ``listing`` when there are ``items``."""
    return _user(text + (f"\n\nHere are the existing {listing}:\n\n{items}" if items else ""))


def _hook_success(a: dict) -> list[dict]:
    if a.get("hookEvent") not in ("SessionStart", "UserPromptSubmit") or not a.get("content"):
        return []
    return _user(f"{a.get('hookName')} hook success: {a['content']}")


def _lines_delta(header_added: str, header_removed: str, added: str, removed: str) -> Callable[[dict], list[dict]]:
    def render_delta(a: dict) -> list[dict]:
        parts = []
        if a.get(added):
            parts.append(f"{header_added}\n" + "\n".join(a[added]))
        if a.get(removed):
            parts.append(f"{header_removed}\n" + "\n".join(a[removed]))
        return _user("\n\n".join(parts)) if parts else []
    return render_delta


def _mcp_instructions(a: dict) -> list[dict]:
    parts = []
    if a.get("addedBlocks"):
        parts.append("# MCP Server Instructions\n\nThe following MCP servers have provided instructions for how to "
                     "use their tools and resources:\n\n" + "\n\n".join(a["addedBlocks"]))
    if a.get("removedNames"):
        parts.append("The following MCP servers have disconnected. Their instructions above no longer apply:\n"
                     + "\n".join(a["removedNames"]))
    return _user("\n\n".join(parts)) if parts else []


def _queued(a: dict) -> list[dict]:
    p = a.get("prompt")
    text = "\n".join(b.get("text", "") for b in p if isinstance(b, dict) and b.get("type") == "text") \
        if isinstance(p, list) else str(p or "")
    return _user(text) if text else []


RENDERERS: dict[str, Callable[[dict], list[dict]]] = {
    "file": _file,
    "directory": lambda a: _tool_pair("Bash", {"command": f"ls {a.get('path', '')}",
                                               "description": f"Lists files in {a.get('path', '')}"},
                                      _text(a.get("content"))),
    "compact_file_reference": lambda a: _user(
        f"Note: {a.get('filename')} was read before the last conversation was summarized, but the contents are "
        "too large to include. Use Read tool if you need to access it."),
    "plan_file_reference": lambda a: _user(
        f"A plan file exists from plan mode at: {a.get('planFilePath')}\n\nPlan contents:\n\n{a.get('planContent')}"
        "\n\nIf this plan is relevant to the current work and not already complete, continue working on it."),
    "nested_memory": lambda a: _user(
        f"Contents of {(a.get('content') or {}).get('path')}:\n\n{(a.get('content') or {}).get('content')}"),
    "edited_text_file": lambda a: _user(
        f"Note: {a.get('filename')} was modified, either by the user or by a linter. This change was intentional, "
        "so make sure to take it into account as you proceed (ie. don't revert it unless the user asks you to). "
        "Don't tell the user this, since they are already aware. Here are the relevant changes (shown with line "
        f"numbers):\n{a.get('snippet')}"),
    "todo_reminder": _todo,
    "task_reminder": _task,
    "skill_listing": lambda a: _user(
        f"The following skills are available for use with the Skill tool:\n\n{a['content']}") if a.get("content") else [],
    "invoked_skills": lambda a: _user(
        "The following skills were invoked in this session. Continue to follow these guidelines:\n\n"
        + "\n\n---\n\n".join(f"### Skill: {s.get('name')}\nPath: {s.get('path')}\n\n{s.get('content')}"
                             for s in a["skills"])) if a.get("skills") else [],
    "hook_additional_context": lambda a: _user(
        f"{a.get('hookName')} hook additional context: " + "\n".join(map(str, a["content"]))) if a.get("content") else [],
    "hook_success": _hook_success,
    "hook_blocking_error": lambda a: _user(
        f"{a.get('hookName')} hook blocking error from command: \"{(a.get('blockingError') or {}).get('command')}\": "
        f"{(a.get('blockingError') or {}).get('blockingError')}"),
    "hook_stopped_continuation": lambda a: _user(f"{a.get('hookName')} hook stopped continuation: {a.get('message')}"),
    "deferred_tools_delta": _lines_delta(
        "The following deferred tools are now available via ToolSearch:",
        "The following deferred tools are no longer available (their MCP server disconnected). Do not search for "
        "them — ToolSearch will return no match:", "addedLines", "removedNames"),
    "mcp_instructions_delta": _mcp_instructions,
    "queued_command": _queued,
    "critical_system_reminder": lambda a: _user(_text(a.get("content"))),
    "date_change": lambda a: _user(
        f"The date has changed. Today's date is now {a.get('newDate')}. DO NOT mention this to the user explicitly "
        "because they are already aware."),
    "opened_file_in_ide": lambda a: _user(
        f"The user opened the file {a.get('filename')} in the IDE. This may or may not be related to the current task."),
}


def _companion_intro(a: dict) -> list[dict]:
    name, species = a.get("name"), a.get("species")
    return _user(
        f"# Companion\n\nA small {species} named {name} sits beside the user's input box and occasionally comments in a "
        f"speech bubble. You're not {name} — it's a separate watcher.\n\nWhen the user addresses {name} directly (by "
        "name), its bubble will answer. Your job in that moment is to stay out of the way: respond in ONE line or less, "
        f"or just answer any part of the message meant for you. Don't explain that you're not {name} — they know. "
        f"Don't narrate what {name} might say — the bubble handles that.")


_AUTO_MODE_FULL = (
    "## Auto Mode Active\n\nAuto mode is active. The user chose continuous, autonomous execution. You should:\n\n"
    "1. **Execute immediately** — Start implementing right away. Make reasonable assumptions and proceed on low-risk "
    "work.\n"
    "2. **Minimize interruptions** — Prefer making reasonable assumptions over asking questions for routine decisions.\n"
    "3. **Prefer action over planning** — Do not enter plan mode unless the user explicitly asks. When in doubt, start "
    "coding.\n"
    "4. **Expect course corrections** — The user may provide suggestions or course corrections at any point; treat "
    "those as normal input.\n"
    "5. **Do not take overly destructive actions** — Auto mode is not a license to destroy. Anything that deletes data "
    "or modifies shared or production systems still needs explicit user confirmation. If you reach such a decision "
    "point, ask and wait, or course correct to a safer method instead.\n"
    "6. **Avoid data exfiltration** — Post even routine messages to chat platforms or work tickets only if the user has "
    "directed you to. You must not share secrets (e.g. credentials, internal documentation) unless the user has "
    "explicitly authorized both that specific secret and its destination.")
_AUTO_MODE_SPARSE = ("Auto mode still active (see full instructions earlier in conversation). Execute autonomously, "
                     "minimize interruptions, prefer action over planning.")

RENDERERS.update({
    "companion_intro": _companion_intro,
    "auto_mode": lambda a: _user(_AUTO_MODE_SPARSE if a.get("reminderType") == "sparse" else _AUTO_MODE_FULL),
    "auto_mode_exit": lambda a: _user(
        "## Exited Auto Mode\n\nYou have exited auto mode. The user may now want to interact more directly. You "
        "should ask clarifying questions when the approach is ambiguous rather than making assumptions."),
    "plan_mode_exit": lambda a: _user(
        "## Exited Plan Mode\n\nYou have exited plan mode. You can now make edits, run tools, and take actions."
        + (f" The plan file is located at {a.get('planFilePath')} if you need to reference it." if a.get("planExists")
           else "")),
})
INFERRED_TEXT = {k: "wording of Claude Code 2.1.88; other versions may differ"
                 for k in ("companion_intro", "auto_mode", "auto_mode_exit", "plan_mode_exit")}


def render(attachment: dict) -> list[dict] | None:
    """Messages (``role``, ``content``, optional ``tool_calls`` / ``name``) Claude Code sends for one
    attachment: ``[]`` when it sends none, ``None`` when the type is unknown here."""
    kind = attachment.get("type")
    if kind in NOT_SENT:
        return []
    fn = RENDERERS.get(kind)
    if fn is None:
        return None
    try:
        return fn(attachment)
    except (AttributeError, TypeError, KeyError):  # fields not of the shape Claude Code writes: text unknown
        return None

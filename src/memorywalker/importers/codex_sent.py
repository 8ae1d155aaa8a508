"""What Codex sends that its rollout does not record: the compaction request's prompt, the head of the
summary message, and the rule by which it cuts its instructions (the codex importer uses them).

Text of openai/codex (Apache-2.0), as Codex 0.169.0 sent it through the memorywalker gateway.
"""

from __future__ import annotations

import re

from memorywalker.importers.tools import ToolSet

# The compaction request's last user message, and the head of the summary message that replaces the history.
COMPACT_PROMPT = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will resume "
    "the task.\n\nInclude:\n- Current progress and key decisions made\n- Important context, constraints, or user "
    "preferences\n- What remains to be done (clear next steps)\n- Any critical data, examples, or references needed "
    "to continue\n\nBe concise, structured, and focused on helping the next LLM seamlessly continue the work.\n")
SUMMARY_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its thinking process. You also "
    "have access to the state of the tools that were used by that language model. Use this to build on the work that "
    "has already been done and avoid duplicating work. Here is the summary produced by the other language model, use "
    "the information in this summary to assist with your own analysis:")
PROMPT_SOURCE = "assumed: the compaction prompt Codex 0.169.0 sends (not in the rollout)"
PLANNING_SECTIONS = ("## Planning\n", "## `update_plan`\n")  # left out of the instructions without update_plan


def without_planning(text: str) -> str:
    r"""``text`` without its level-2 sections headed "## Planning" and "## `update_plan`" (each up to the
    next heading of level 1 or 2), as Codex sends its instructions when it offers no ``update_plan``.

    >>> without_planning("# A\n## Planning\nx\n### Ex\ny\n## Task\nz\n## `update_plan`\nw\n")
    '# A\n## Task\nz\n'
    """
    parts = re.split(r"(?m)^(?=#{1,2} )", text)
    return "".join(p for p in parts if not p.startswith(PLANNING_SECTIONS))


def system_prompt_rule(instructions: str, tools: ToolSet | None, called: set[str]) -> tuple[str, str]:
    r"""The instructions Codex sent and the rule's decision (``meta.system_prompt_rule``): the planning
    sections go when the given tools lack ``update_plan``; they stay when it is given or was called; with
    neither, the rule is undecided and the text stays whole.

    >>> system_prompt_rule("# A\n## Planning\nx\n", None, set())[1].split(":")[0]
    'undecided'
    """
    if not any(re.search(rf"(?m)^{re.escape(h)}", instructions) for h in PLANNING_SECTIONS):
        return instructions, "not needed: no planning sections in the instructions"
    if tools is not None and "update_plan" not in tools.names:
        return without_planning(instructions), "applied: planning sections left out (update_plan not among the given tools)"
    if tools is not None or "update_plan" in called:
        why = "among the given tools" if tools is not None else "called in the rollout"
        return instructions, f"applied: instructions whole (update_plan {why})"
    return instructions, ("undecided: instructions kept whole; Codex leaves out the planning sections when it offers "
                          "no update_plan, and the rollout does not say")

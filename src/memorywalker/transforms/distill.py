"""Distillation transforms: context distillation (strip procedural guidance) and filtered teacher imitation.

    memorywalker distill --strip-guidance --guidance-file guidance.txt runs.jsonl -o stripped.jsonl
    memorywalker distill --filter-teacher --teacher expert runs.jsonl -o verified.jsonl

**Context distillation** (``strip-guidance``): an episode sampled under a long procedural system prompt
becomes a derived record whose system messages no longer carry the guidance, with the same targets: the
response token ids are kept as recorded (token-identical), the context token ids are re-rendered for
the shorter prompt, and the rollout logprobs are dropped (they were sampled under the long prompt and
are not the behaviour policy's logprobs of the new context). Only system messages are edited: task
prompts, tool observations and harness artifacts (dynamic observations) are never stripped, even when
they quote the guidance. The record keeps both prompt versions in ``meta.distill``.

**Filtered teacher imitation** (``filter-teacher``): keep only a teacher's verified successes (reward 1
and termination ``answered``), each as a derived record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memorywalker.errors import InputError
from memorywalker.records.derive import derive
from memorywalker.records.schema import Trajectory

STRIP_GUIDANCE, FILTER_TEACHER = "strip-guidance", "filter-teacher"
VERSION = "1"

# A procedural guidance block for the web-search world: what a long system prompt adds to the short one.
WEBSEARCH_GUIDANCE = (
    "\n\nProcedure:\n"
    "1. Split the question into lookups, one entity and one attribute each.\n"
    "2. For each lookup, search for the entity by its exact name; if no result has that title, search "
    "again with the word 'facts' added; if that fails too, open the page id you would expect (the name "
    "in lowercase with hyphens).\n"
    "3. Open the page whose title is exactly the entity name. Read only the Facts box; ignore the prose, "
    "which mentions many other names and numbers.\n"
    "4. Follow links by the page id in brackets, never by searching for the linked name.\n"
    "5. Keep every fact you learned in your notes; the notes are all you will remember.\n"
    "6. For sums and counts, add up the noted values yourself; for comparisons answer with the name.\n"
    "7. Answer with the value only: no units, no sentence."
)


@dataclass
class TransformStats:
    """What a transform read and wrote, in records and in tokens (context + response of every call)."""

    records_in: int = 0
    records_out: int = 0
    tokens_in: int = 0
    tokens_out: int = 0

    @property
    def expansion(self) -> float:
        """Token expansion ratio: tokens written / tokens read (0 when nothing was read)."""
        return self.tokens_out / self.tokens_in if self.tokens_in else 0.0

    def as_dict(self) -> dict:
        return {"records_in": self.records_in, "records_out": self.records_out, "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "expansion": self.expansion}


def record_tokens(traj: Trajectory) -> int:
    """Context + response tokens over the calls of ``traj`` (recorded ids; 0 for a call without them)."""
    return sum(len(c.context_tokens or []) + len(c.response_tokens or []) for c in traj.calls)


# --- strip guidance --------------------------------------------------------------------------------------

def strip_guidance(traj: Trajectory, guidance: str, renderer) -> Trajectory:
    """``traj`` with ``guidance`` removed from its system messages, the same response tokens, and context
    tokens re-rendered by ``renderer`` (a :class:`~memorywalker.render.Renderer`).

    Raises ``InputError`` when no system message contains ``guidance`` (nothing to distil).
    """
    if not guidance:
        raise InputError("strip-guidance needs a non-empty guidance text")
    before = [m.content for m in traj.messages if m.role == "system"]
    if not any(guidance in c for c in before):
        raise InputError(f"{traj.id}: no system message contains the guidance text")
    messages = [m.model_copy(update={"content": m.content.replace(guidance, "")})
                if m.role == "system" and guidance in m.content else m for m in traj.messages]
    after = [m.content for m in messages if m.role == "system"]
    calls = [c.model_copy(update={"context_tokens": None, "rollout_logprobs": None, "rollout_top_logprobs": None})
             for c in traj.calls]
    child = derive(traj, STRIP_GUIDANCE, VERSION, messages=messages, calls=calls,
                   meta={**traj.meta, "distill": {"prompt_before": before, "prompt_after": after,
                                                  "guidance": guidance}})
    # Context ids for the stripped prompt; response ids stay the recorded ones (the targets).
    rendered = renderer.render(child)
    calls = [c.model_copy(update={"context_tokens": rc.tokens[: rc.prompt_len]
                                  if orig.context_tokens is not None else None})
             for c, rc, orig in zip(child.calls, rendered.calls, traj.calls, strict=True)]
    return child.model_copy(update={"calls": calls})


# --- filter teacher ----------------------------------------------------------------------------------------

def verified_success(traj: Trajectory) -> bool:
    """A verified success: the environment's reward is 1 and the episode ended with an answer."""
    return traj.reward == 1.0 and traj.outcome.get("termination") == "answered"


def filter_teacher(traj: Trajectory, teacher: str | None = None) -> Trajectory | None:
    """The derived record of a verified success of ``teacher`` (``meta.policy.name``; any when None)."""
    name = (traj.meta.get("policy") or {}).get("name")
    if teacher is not None and name != teacher:
        return None
    return derive(traj, FILTER_TEACHER, VERSION) if verified_success(traj) else None


def distill(trajs: Iterable[Trajectory], transform: str, *, guidance: str | None = None, renderer=None,
            teacher: str | None = None) -> tuple[list[Trajectory], TransformStats]:
    """Apply ``transform`` (``strip-guidance`` | ``filter-teacher``) to every record; return the derived
    records and the token counts."""
    if transform not in (STRIP_GUIDANCE, FILTER_TEACHER):
        raise InputError(f"unknown distill transform {transform!r}; valid: {STRIP_GUIDANCE}, {FILTER_TEACHER}")
    out, stats = [], TransformStats()
    for t in trajs:
        stats.records_in += 1
        stats.tokens_in += record_tokens(t)
        child = strip_guidance(t, guidance or "", renderer) if transform == STRIP_GUIDANCE else filter_teacher(t, teacher)
        if child is not None:
            out.append(child)
            stats.records_out += 1
            stats.tokens_out += record_tokens(child)
    return out, stats

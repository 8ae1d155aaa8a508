"""Record validation: every record is accepted or rejected with one specific reason code.

:data:`REASONS` is the documented table of codes, the one source of their meanings: the importers'
table (``importers/base.py``) takes the codes both give (:data:`SHARED_REASONS`) from it.
:func:`check_trajectory` checks the structural
invariants a parsed :class:`~memorywalker.records.schema.Trajectory` must satisfy before rendering;
line-level problems (encoding, JSON, truncation) are found by :mod:`memorywalker.records.io`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import ValidationError

from memorywalker.errors import InputError
from memorywalker.records.schema import Trajectory

REASONS: dict[str, str] = {
    # line level
    "empty_line": "the line is blank; a record must be one JSON object",
    "non_utf8": "the line is not valid UTF-8",
    "bad_json": "a line (or a whole-file JSON document) is not valid JSON",
    "truncated_line": "the final line has no newline and does not parse: the file was cut off mid-record",
    "record_too_large": "a line is longer than the per-record size limit (MEMORYWALKER_MAX_RECORD_BYTES)",
    "too_deep": "arrays/objects nest deeper than the per-record depth limit (MEMORYWALKER_MAX_RECORD_DEPTH)",
    "not_an_object": "a record's JSON value is not an object",
    "schema_version": "the 'schema' field is missing or names a version this reader does not know",
    "duplicate_trajectory_id": "a trajectory with the same id was already accepted from this input",
    # shape
    "missing_field": "a field the record requires is absent (schema v1's, or the log format's)",
    "wrong_type": "a field has the wrong type or a value outside its allowed set",
    "unknown_field": "a field that schema v1 does not define",
    "no_calls": "the trajectory (or the imported input) has no model call",
    # identity
    "duplicate_message_id": "two messages share an id",
    "duplicate_call_id": "two calls share an id",
    "duplicate_tool_call_id": "two tool calls in one call's context and response share an id",
    # references
    "unknown_message_id": "a call's context names a message that is not in the message table",
    "unknown_response_id": "a call's response names a message that is not in the message table",
    "unknown_tool": "a call offers a tool that is not in the tool-schema table",
    "eviction_unknown_call": "an eviction names a call that does not exist",
    "eviction_unknown_message": "an eviction removes or inserts a message that is not in the table",
    # conversation structure
    "empty_context": "a call's context is empty",
    "duplicate_context_message": "a call's context lists the same message twice",
    "response_not_assistant": "a call's response is not an assistant message",
    "response_in_context": "a call's response also appears in its own context",
    "tool_result_missing_id": "a tool message has no tool_call_id",
    "tool_result_without_call": "a tool result in a context answers no tool call issued earlier in that context",
    # tokens and log-probabilities
    "partial_tokens": "a call records context_tokens or response_tokens but not both",
    "token_out_of_vocab": "a recorded token id is negative or not below the tokenizer's vocabulary size",
    "logprob_length_mismatch": "rollout_logprobs has a different length than response_tokens (or has none)",
    "top_logprobs_length_mismatch": "rollout_top_logprobs has a different length than response_tokens",
    "invalid_logprob": "a rollout log-probability is NaN, infinite or positive",
    "invalid_reward": "the reward is NaN or infinite",
    # what a model can take (readers that feed a model)
    "too_long": "a call renders to more tokens than the model has positions (max_seq_len); set aside before any forward",
}

# The codes the importers give too, with these meanings (importers/base.py IMPORT_REASONS takes them from here).
SHARED_REASONS = ("bad_json", "truncated_line", "record_too_large", "too_deep", "not_an_object", "missing_field",
                  "wrong_type", "no_calls")


class RecordError(InputError):
    """A record violates schema v1; ``code`` is a key of :data:`REASONS`."""

    def __init__(self, code: str, message: str):
        assert code in REASONS, code
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Reject:
    line: int  # 1-based line number in the input
    code: str
    message: str
    raw: str  # the original line (decoded with replacement characters if it was not UTF-8)
    source: str = ""


_PYDANTIC_CODES = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_field",
}

# Log-probabilities are <= 0; engines in bf16 report values a hair above 0 for near-certain tokens.
_LOGPROB_SLACK = 1e-4


def from_validation_error(err: ValidationError) -> RecordError:
    """Map pydantic's first error to a reason code with the field path in the message."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    code = _PYDANTIC_CODES.get(first["type"], "wrong_type")
    return RecordError(code, f"{where}: {first['msg']} ({err.error_count()} problem(s) in the record)")


def check_trajectory(traj: Trajectory, vocab_size: int | None = None) -> None:
    """Raise :class:`RecordError` for the first structural problem of ``traj``.

    ``vocab_size`` enables the out-of-vocabulary check on recorded token ids.
    """
    if not traj.calls:
        raise RecordError("no_calls", f"trajectory {traj.id!r} has no calls")
    if traj.reward is not None and not math.isfinite(traj.reward):
        raise RecordError("invalid_reward", f"reward is {traj.reward}")

    table = {}
    for m in traj.messages:
        if m.id in table:
            raise RecordError("duplicate_message_id", f"message id {m.id!r} appears twice")
        table[m.id] = m

    # Tool-call ids are unique within what one call sees (its context and response), not across the
    # trajectory: a response the harness sent back re-serialized (template drift) is a second message
    # with the same tool calls, in other contexts than the first.
    for m in traj.messages:
        if m.role == "tool" and not m.tool_call_id:
            raise RecordError("tool_result_missing_id", f"tool message {m.id!r} has no tool_call_id")

    tool_names = {t.name for t in traj.tools}
    call_ids: set[str] = set()
    for i, call in enumerate(traj.calls):
        where = f"call {call.id!r} (#{i})"
        if call.id in call_ids:
            raise RecordError("duplicate_call_id", f"call id {call.id!r} appears twice")
        call_ids.add(call.id)
        if not call.context:
            raise RecordError("empty_context", f"{where} has an empty context")
        if len(set(call.context)) != len(call.context):
            dup = next(x for x in call.context if call.context.count(x) > 1)
            raise RecordError("duplicate_context_message", f"{where} lists message {dup!r} twice")
        for mid in call.context:
            if mid not in table:
                raise RecordError("unknown_message_id", f"{where} context names unknown message {mid!r}")
        if call.response not in table:
            raise RecordError("unknown_response_id", f"{where} response names unknown message {call.response!r}")
        if table[call.response].role != "assistant":
            raise RecordError(
                "response_not_assistant",
                f"{where} response {call.response!r} has role {table[call.response].role!r}",
            )
        if call.response in call.context:
            raise RecordError("response_in_context", f"{where} response {call.response!r} is also in its context")
        _check_tool_binding(where, [table[mid] for mid in call.context], table[call.response])
        if call.tools is not None:
            missing = [t for t in call.tools if t not in tool_names]
            if missing:
                raise RecordError("unknown_tool", f"{where} offers tools not in the tool table: {missing}")
        _check_tokens(where, call, vocab_size)

    for ev in traj.evictions:
        if ev.before_call not in call_ids:
            raise RecordError("eviction_unknown_call", f"eviction names unknown call {ev.before_call!r}")
        for mid in [*ev.removed, *ev.inserted]:
            if mid not in table:
                raise RecordError("eviction_unknown_message", f"eviction before {ev.before_call!r} names {mid!r}")


def _check_tool_binding(where: str, context, response) -> None:
    issued: set[str] = set()
    for m in [*context, response]:
        if m.role == "assistant":
            for tc in m.tool_calls:
                if tc.id in issued:
                    raise RecordError("duplicate_tool_call_id", f"{where}: tool call id {tc.id!r} appears twice")
                issued.add(tc.id)
        elif m.role == "tool" and m.tool_call_id not in issued:
            raise RecordError(
                "tool_result_without_call",
                f"{where}: tool message {m.id!r} answers {m.tool_call_id!r}, which no earlier "
                "assistant message in this context issued",
            )


def _one_per_response_token(where: str, call, rows: list, what: str, reason: str) -> None:
    """``rows`` (of ``call``'s rollout logprobs or top-k) must hold one entry per response token."""
    n = len(call.response_tokens) if call.response_tokens is not None else None
    if n != len(rows):
        raise RecordError(reason, f"{where} has {len(rows)} {what} for {n} response tokens")


def _check_tokens(where: str, call, vocab_size: int | None) -> None:
    has_ctx, has_resp = call.context_tokens is not None, call.response_tokens is not None
    if has_ctx != has_resp:
        raise RecordError("partial_tokens", f"{where} has {'context' if has_ctx else 'response'}_tokens only")
    if vocab_size is not None and has_ctx:
        for name, ids in (("context_tokens", call.context_tokens), ("response_tokens", call.response_tokens)):
            bad = next((t for t in ids if t < 0 or t >= vocab_size), None)
            if bad is not None:
                raise RecordError("token_out_of_vocab", f"{where} {name} has id {bad} (vocab size {vocab_size})")
    if call.rollout_logprobs is not None:
        _one_per_response_token(where, call, call.rollout_logprobs, "rollout_logprobs", "logprob_length_mismatch")
        bad = next((x for x in call.rollout_logprobs if not math.isfinite(x) or x > _LOGPROB_SLACK), None)
        if bad is not None:
            raise RecordError("invalid_logprob", f"{where} rollout_logprobs contains {bad}")
    if call.rollout_top_logprobs is not None:
        _one_per_response_token(where, call, call.rollout_top_logprobs, "top-k rows", "top_logprobs_length_mismatch")

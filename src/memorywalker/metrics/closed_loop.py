"""What one evaluated episode says about its policy: acceptance, call validity, schema following, cost.

Pure functions of a recorded trajectory (schema v1, as ``run_episode`` writes it), so a report's numbers
can be recomputed from the saved episodes. Definitions (docs/eval.md):

* **accepted** — the episode's reward is 1.0 (the environment accepted the answer). Any other ending
  (``max_steps``: the step budget ran out; ``context_overflow``; a wrong answer; a failed trial) is a
  failure, never dropped.
* **call validity** — every *act* call (a proposal) gets exactly one class, the first that applies:
  ``truncated_proposal`` (the response hit the token limit and no tool call could be parsed),
  ``malformed_output`` (no parseable tool call, or arguments that are not a JSON object),
  ``undeclared_tool`` (a tool not among those delivered to the call), ``schema_violation`` (arguments that
  break the delivered JSON schema: a missing required key, a key the schema does not declare, a value of
  the wrong type), ``tool_execution_error`` (the environment answered ``Error: ...``), else ``valid``.
* **SFA** (schema-following accuracy) — the fraction of proposals that parse into at least one tool call,
  every one of them declared to the call and with arguments valid under its delivered schema.
* **PRE** (parametric recall error) — among parsed calls to declared tools with JSON-object arguments,
  the fraction whose argument *names* are not the delivered schema's (a key it does not declare, or a
  required key missing): the model used parameter names recalled from its weights instead of reading
  the schema it was given. Type errors are schema violations but not PRE.
* **cost** — tokens: prompt + response tokens of every call (act and summarize/fold), each prompt counted
  in full as a stateless endpoint bills it; turns: act calls.
"""

from __future__ import annotations

from typing import Any

from memorywalker.metrics.stats import (
    cost_per_accepted,
    paired_bootstrap_nested,
    paired_seed_differences,
    wilson_interval,
)
from memorywalker.records.schema import Call, Message, ToolCall, ToolSchema, Trajectory
from memorywalker.render.toolcalls import call_arguments

VALIDITY = ("valid", "malformed_output", "schema_violation", "undeclared_tool", "truncated_proposal",
            "tool_execution_error")
_WORST_FIRST = ("malformed_output", "undeclared_tool", "schema_violation", "tool_execution_error")
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                            "boolean": (bool,), "object": (dict,), "array": (list,)}


def schema_errors(arguments: dict[str, Any], parameters: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(name errors, type errors)`` of ``arguments`` under a tool's JSON-schema ``parameters``.

    Name errors: a required key missing or a key the schema's ``properties`` do not declare (what PRE
    counts). Type errors: a declared key whose value has another JSON type (a bool is not a number).

    >>> p = {"type": "object", "properties": {"page": {"type": "string"}}, "required": ["page"]}
    >>> schema_errors({"page": "x"}, p), schema_errors({"id": "x"}, p), schema_errors({"page": 5}, p)
    (([], []), (['missing page', 'undeclared id'], []), ([], ['page: integer, not string']))
    """
    props = parameters.get("properties") or {}
    names = [f"missing {k}" for k in parameters.get("required", []) if k not in arguments]
    names += [f"undeclared {k}" for k in arguments if props and k not in props]
    types = []
    for k, v in arguments.items():
        want = (props.get(k) or {}).get("type")
        if want in _JSON_TYPES:
            ok = isinstance(v, _JSON_TYPES[want]) and not (isinstance(v, bool) and want != "boolean")
            if not ok:
                types.append(f"{k}: {_json_type(v)}, not {want}")
    return names, types


def _json_type(v: Any) -> str:
    for name, kinds in (("boolean", (bool,)), ("integer", (int,)), ("number", (float,)), ("string", (str,)),
                        ("object", (dict,)), ("array", (list,))):
        if isinstance(v, kinds):
            return name
    return "null"


def tool_call_class(tc: ToolCall, offered: list[str], schemas: dict[str, ToolSchema],
                    observation: str | None) -> str:
    """The validity class of one parsed tool call (``malformed_output`` .. ``valid``)."""
    if tc.name not in offered or tc.name not in schemas:
        return "undeclared_tool"
    args = call_arguments(tc.arguments)
    if args is None:
        return "malformed_output"
    names, types = schema_errors(args, schemas[tc.name].parameters)
    if names or types:
        return "schema_violation"
    if observation is not None and observation.startswith("Error"):
        return "tool_execution_error"
    return "valid"


def proposal_class(call: Call, response: Message, schemas: dict[str, ToolSchema],
                   observations: dict[str, str]) -> str:
    """The validity class of one act call: see the module docstring for the order."""
    if not response.tool_calls:
        return "truncated_proposal" if call.finish_reason == "length" else "malformed_output"
    offered = call.tools if call.tools is not None else list(schemas)
    classes = {tool_call_class(tc, offered, schemas, observations.get(tc.id)) for tc in response.tool_calls}
    return next((c for c in _WORST_FIRST if c in classes), "valid")


def trial_row(traj: Trajectory) -> dict[str, Any]:
    """One evaluated episode as the numbers a report aggregates."""
    table = traj.message_table()
    schemas = {t.name: t for t in traj.tools}
    observations = {m.tool_call_id: m.content for m in traj.messages if m.role == "tool" and m.tool_call_id}
    validity = dict.fromkeys(VALIDITY, 0)
    followed = pre_errors = pre_total = 0
    act = [c for c in traj.calls if c.purpose == "act"]
    for call in act:
        resp = table[call.response]
        cls = proposal_class(call, resp, schemas, observations)
        validity[cls] += 1
        offered = call.tools if call.tools is not None else list(schemas)
        ok = bool(resp.tool_calls)
        for tc in resp.tool_calls:
            args = call_arguments(tc.arguments)
            if tc.name not in offered or tc.name not in schemas or args is None:
                ok = False
                continue
            names, types = schema_errors(args, schemas[tc.name].parameters)
            pre_total += 1
            pre_errors += bool(names)
            ok = ok and not names and not types
        followed += ok
    tokens = sum(len(c.context_tokens or []) + len(c.response_tokens or []) for c in traj.calls)
    return {
        "id": traj.id,
        "task": traj.task.id if traj.task is not None else traj.id,
        "sample": int(traj.meta.get("sample", 0)),
        "accepted": traj.reward == 1.0,
        "termination": traj.outcome.get("termination", "unknown"),
        "tokens": tokens,
        "turns": len(act),
        "calls": len(traj.calls),
        "validity": validity,
        "sfa_followed": followed,
        "pre_errors": pre_errors,
        "pre_total": pre_total,
    }


def failed_trial_row(episode_id: str, task_id: str, sample: int, error: str) -> dict[str, Any]:
    """A trial that started but did not finish (an endpoint timeout, a dropped connection): a failure."""
    return {"id": episode_id, "task": task_id, "sample": sample, "accepted": False, "termination": "error",
            "error": error, "tokens": 0, "turns": 0, "calls": 0, "validity": dict.fromkeys(VALIDITY, 0),
            "sfa_followed": 0, "pre_errors": 0, "pre_total": 0}


def summarize(rows: list[dict[str, Any]], *, z: float) -> dict[str, Any]:
    """Aggregate trial rows of one model on one suite: acceptance with its Wilson interval, validity
    counts and rates over proposals, SFA, PRE, and cost per accepted task.

    >>> r = summarize([{"accepted": True, "termination": "answered", "tokens": 30, "turns": 2,
    ...                 "validity": dict.fromkeys(VALIDITY, 0) | {"valid": 2}, "sfa_followed": 2,
    ...                 "pre_errors": 0, "pre_total": 2},
    ...                {"accepted": False, "termination": "max_steps", "tokens": 50, "turns": 2,
    ...                 "validity": dict.fromkeys(VALIDITY, 0) | {"malformed_output": 2}, "sfa_followed": 0,
    ...                 "pre_errors": 0, "pre_total": 0}], z=1.96)
    >>> r["accepted"], r["trials"], r["tokens_per_accepted"], r["sfa"], r["validity_rate"]["malformed_output"]
    (1, 2, 80.0, 0.5, 0.5)
    """
    n = len(rows)
    k = sum(bool(r["accepted"]) for r in rows)
    lo, hi = wilson_interval(k, n, z)
    validity = {c: sum(r["validity"][c] for r in rows) for c in VALIDITY}
    proposals = sum(validity.values())
    pre_total = sum(r["pre_total"] for r in rows)
    terminations: dict[str, int] = {}
    for r in rows:
        terminations[r["termination"]] = terminations.get(r["termination"], 0) + 1
    tokens, turns = sum(r["tokens"] for r in rows), sum(r["turns"] for r in rows)
    return {
        "trials": n,
        "accepted": k,
        "acceptance": k / n if n else 0.0,
        "acceptance_ci": [lo, hi],
        "terminations": dict(sorted(terminations.items())),
        "proposals": proposals,
        "validity": validity,
        "validity_rate": {c: (v / proposals if proposals else 0.0) for c, v in validity.items()},
        "sfa": sum(r["sfa_followed"] for r in rows) / proposals if proposals else 0.0,
        "pre": sum(r["pre_errors"] for r in rows) / pre_total if pre_total else 0.0,
        "pre_calls": pre_total,
        "tokens_total": tokens,
        "turns_total": turns,
        "tokens_per_accepted": cost_per_accepted(tokens, k),
        "turns_per_accepted": cost_per_accepted(turns, k),
    }


def per_task_acceptance(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean acceptance per task over its samples (the unit the paired bootstrap resamples).

    >>> per_task_acceptance([{"task": "a", "accepted": True}, {"task": "a", "accepted": False},
    ...                      {"task": "b", "accepted": True}])
    {'a': 0.5, 'b': 1.0}
    """
    acc: dict[str, list[float]] = {}
    for r in rows:
        acc.setdefault(r["task"], []).append(float(r["accepted"]))
    return {t: sum(v) / len(v) for t, v in sorted(acc.items())}


# What the paired test compares besides acceptance, per trial: its cost and the validity of its proposals.
PAIRED_METRICS = ("acceptance", "turns", "tokens", "malformed")


def trial_value(row: dict[str, Any], metric: str) -> float:
    """One trial's number for a :data:`PAIRED_METRICS` entry: accepted (0/1), act calls, tokens (every call's
    context and response), or the share of its proposals that were malformed (0 without proposals).

    >>> row = {"accepted": False, "turns": 3, "tokens": 90, "validity": dict.fromkeys(VALIDITY, 0) | {"valid": 2, "malformed_output": 1}}
    >>> [round(trial_value(row, m), 3) for m in PAIRED_METRICS]
    [0.0, 3.0, 90.0, 0.333]
    """
    if metric == "acceptance":
        return float(row["accepted"])
    if metric in ("turns", "tokens"):
        return float(row[metric])
    if metric == "malformed":
        proposals = sum(row["validity"].values())
        return row["validity"]["malformed_output"] / proposals if proposals else 0.0
    raise ValueError(f"unknown paired metric {metric!r}; valid: {PAIRED_METRICS}")


def per_task_seeds(rows: list[dict[str, Any]], metric: str) -> dict[str, dict[int, float]]:
    """``metric`` per task and per sample (the seed the model's and the baseline's episodes share).

    >>> per_task_seeds([{"task": "a", "sample": 0, "accepted": True}, {"task": "a", "sample": 1, "accepted": False}],
    ...                "acceptance")
    {'a': {0: 1.0, 1: 0.0}}
    """
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        out.setdefault(r["task"], {})[int(r.get("sample", 0))] = trial_value(r, metric)
    return out


def paired_metric(a: list[dict[str, Any]], b: list[dict[str, Any]], metric: str, *, alpha: float = 0.05,
                  resamples: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """``a`` minus ``b`` for one :data:`PAIRED_METRICS` entry, paired by task and seed: the estimate, its
    interval at level 1 - alpha (:func:`~memorywalker.metrics.stats.paired_bootstrap_nested`), the counts."""
    diffs = paired_seed_differences(per_task_seeds(a, metric), per_task_seeds(b, metric))
    mean, lo, hi = paired_bootstrap_nested(diffs, alpha=alpha, resamples=resamples, seed=seed)
    return {"tasks": len(diffs), "seeds": sum(len(d) for d in diffs.values()), "difference": mean, "ci": [lo, hi],
            "significant": not lo <= 0.0 <= hi}

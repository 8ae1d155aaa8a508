"""DAgger's data transform (the recipe is :mod:`memorywalker.recipes.dagger`): a mixed policy that asks an
authorized labeler for its action at every act call the learner faces, verifies each label by letting the
labeler continue from it in a copy of the environment, and turns the verified labels into derived
records (one call each, the learner's delivered context, the label as the response).
"""

from __future__ import annotations

import copy
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.derive import derive
from memorywalker.records.schema import Call, Message, ToolCall, Trajectory
from memorywalker.render.toolcalls import call_arguments, parse_response
from memorywalker.rollout.environments.base import Environment
from memorywalker.rollout.episodes.harness import call_seed
from memorywalker.samplers.base import Policy, PolicyOutput, PolicyRequest

TRANSFORM, VERSION = "dagger", "1"


# --- the mixed policy -------------------------------------------------------------------------------------

def as_message(out: PolicyOutput, tokenizer) -> Message:
    """A policy output as an assistant message (sampled token ids are decoded and parsed)."""
    if out.message is not None:
        return out.message
    ids = list(out.token_ids or [])
    text = tokenizer.decode(ids, skip_special_tokens=True)
    parsed = parse_response(text)
    return Message(id="", role="assistant", content=parsed.content if parsed.error is None else text,
                   author="model", tool_calls=[ToolCall(id="", name=n, arguments=a) for n, a in parsed.tool_calls])


def action_of(m: Message) -> tuple[str, Any] | None:
    """(tool name, arguments) of a response's first tool call; None when it calls none.

    >>> action_of(Message(id="", role="assistant", tool_calls=[ToolCall(id="", name="open", arguments='{"page": "x"}')]))
    ('open', {'page': 'x'})
    """
    if not m.tool_calls:
        return None
    tc = m.tool_calls[0]
    return tc.name, call_arguments(tc.arguments)


def verify_label(labeler: Policy, request: PolicyRequest, label: Message, env: Environment, *,
                 max_steps: int, tokenizer=None) -> tuple[bool, int]:
    """Execute ``label`` in ``env`` (already reset on the task), let ``labeler`` (a copy in the state it
    proposed the label from) continue without compression; (reward == 1, act calls used)."""
    messages = list(request.messages)
    msg = label
    for step in range(max_steps):
        if step:
            out = labeler(PolicyRequest(prompt_ids=list(request.prompt_ids), messages=list(messages),
                                        tools=list(request.tools), purpose="act",
                                        call_index=request.call_index + step, seed=request.seed + step))
            msg = as_message(out, tokenizer)
        tcs = [tc.model_copy(update={"id": f"verify-{step}-{j}"}) for j, tc in enumerate(msg.tool_calls)]
        messages.append(msg.model_copy(update={"id": f"verify-{step}", "tool_calls": tcs}))
        if not tcs:
            return False, step + 1
        for tc in tcs:
            args = call_arguments(tc.arguments)
            result = env.step(tc.name, args if args is not None else {})
            messages.append(Message(id=f"verify-{step}-{tc.id}-obs", role="tool", content=result.observation,
                                    tool_call_id=tc.id, name=tc.name, author="environment"))
            if result.done:
                return result.reward == 1.0, step + 1
    return False, max_steps


class MixedPolicy:
    """Executes the labeler's proposal with probability ``beta`` (per call, seeded), else the learner's;
    records the label of every act call, whether it verified, and the learner's proposal. A summary the
    learner wrote is the learner's too: a label whose context holds it is at a learner-reached state."""

    name = "dagger-mixed"

    def __init__(self, learner: Policy, labeler: Policy, beta: float, tokenizer, verify_env: Environment, *,
                 max_steps: int):
        self.learner, self.labeler, self.beta, self.tok = learner, labeler, beta, tokenizer
        self.verify_env, self.max_steps = verify_env, max_steps
        self.labels: list[dict[str, Any]] = []

    def start(self, task) -> None:
        self.task, self.labels = task, []
        self.learner.start(task)
        self.labeler.start(task)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "beta": self.beta, "learner": self.learner.config(),
                "labeler": self.labeler.config()}

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        use_labeler = call_seed(request.seed, "beta") / 2 ** 63 < self.beta
        label_out = self.labeler(request)  # every call: a stateful labeler follows the whole episode
        if request.purpose != "act":  # a summary (or fold) the harness asks for: whoever writes it shapes the state
            out = label_out if use_labeler else self.learner(request)
            out.meta = {**out.meta, "dagger_executed": "labeler" if use_labeler else "learner"}
            return out
        label = as_message(label_out, self.tok)
        self.verify_env.reset(self.task)
        ok, steps = verify_label(copy.deepcopy(self.labeler), request, label, self.verify_env,
                                 max_steps=self.max_steps, tokenizer=self.tok)
        learner_out = self.learner(request)
        learner_action = action_of(as_message(learner_out, self.tok))
        self.labels.append({"call_index": request.call_index, "label": label, "verified": ok,
                            "verify_steps": steps, "executed": "labeler" if use_labeler else "learner",
                            "agree": learner_action == action_of(label)})
        out = label_out if use_labeler else learner_out
        out.meta = {**out.meta, "dagger_executed": "labeler" if use_labeler else "learner"}
        return out


# --- labels to derived records -------------------------------------------------------------------------------

def label_records(traj: Trajectory, labels: list[dict[str, Any]], renderer, *, round_k: int,
                  beta: float) -> list[Trajectory]:
    """One derived record per verified label: the call's delivered context, the label as the response."""
    table = traj.message_table()
    executed = {c.response: c.meta.get("dagger_executed") for c in traj.calls}
    index = {c.id: i for i, c in enumerate(traj.calls)}
    for e in traj.evictions:  # what a summary call wrote enters the context as the messages its eviction inserts
        before = index.get(e.before_call, 0)
        writer = next((c for c in reversed(traj.calls[:before]) if c.purpose != "act"), None)
        if e.kind in ("summarize", "fold") and writer is not None:
            executed |= dict.fromkeys(e.inserted, writer.meta.get("dagger_executed"))
    out = []
    for lab in labels:
        if not lab["verified"]:
            continue
        i = lab["call_index"]
        call = traj.calls[i]
        context = [table[m] for m in call.context]
        learner_state = any(executed.get(m.id) == "learner" for m in context)
        rid = f"label-{i}"
        label: Message = lab["label"]
        tcs = [tc.model_copy(update={"id": f"{rid}-tc{j}"}) for j, tc in enumerate(label.tool_calls)]
        resp = label.model_copy(update={"id": rid, "tool_calls": tcs, "author": "model"})
        new_call = Call(id="call-0", context=list(call.context), response=rid, tools=call.tools,
                        purpose="act", meta={"labeled_call": call.id})
        child = derive(traj, TRANSFORM, VERSION, index=i, messages=[*context, resp], calls=[new_call], evictions=[],
                       reward=None, outcome={"label_verified": True, "verify_steps": lab["verify_steps"]},
                       meta={**traj.meta, "dagger": {"round": round_k, "beta": beta, "labeled_call": call.id,
                                                     "learner_state": learner_state, "agree": lab["agree"]}})
        rc = renderer.render(child).calls[0]
        if call.context_tokens is not None and list(call.context_tokens) != rc.tokens[: rc.prompt_len]:
            raise InputError(f"{traj.id} {call.id}: the recorded context does not re-render to its tokens")
        done = new_call.model_copy(update={"context_tokens": rc.tokens[: rc.prompt_len],
                                           "response_tokens": rc.tokens[rc.prompt_len:]})
        out.append(child.model_copy(update={"calls": [done]}))
    return out


# --- rounds ------------------------------------------------------------------------------------------------


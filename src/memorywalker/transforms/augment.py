"""Schema augmentation: the same episode under a renamed and restructured tool interface.

    memorywalker augment expert.jsonl -o augmented.jsonl --copies 2 --seed 0 --tokenizer DIR

A :class:`SchemaMap` (drawn from a seed) renames every tool and argument identifier of the environment's
tools, reorders the declarations and the fields of each ``parameters`` object, adds unused distractor
tools and removes one optional argument per tool that has one. :func:`augment_record` applies it
coherently to a recorded trajectory: the tool table, every call's offered tools, the tool calls (names
and argument keys), the tool results' names, and every text that mentions an identifier (system prompt,
observations, error messages, the question, notes) — by whole-word, case-sensitive replacement, the way
an identifier is mentioned. Recorded token ids are dropped (they encode the old names; the renderer
re-tokenizes). :func:`check_no_old_identifiers` rejects a derived record in which an old identifier
survives anywhere (every key and string of the record except its parent's id).

:class:`AugmentedEnv` is the environment's adapter for the renamed interface (rollouts, evaluation, the
fresh observation of a call whose removed argument changes its result); :class:`RenamedPolicy` lets a
policy written against the original interface (the scripted expert) act through it.

>>> from memorywalker.rollout.environments.websearch.env import TOOLS
>>> m = make_schema_map(TOOLS, seed=0)
>>> sorted(m.words) == ['answer', 'open', 'page', 'query', 'search', 'text']
True
>>> m.rewrite_text("Call answer once you know the answer.").count("answer")
0
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from tqdm import tqdm

from memorywalker.errors import InputError
from memorywalker.records import TrajectoryReader, write_trajectories
from memorywalker.records.derive import derive
from memorywalker.records.schema import Task, ToolSchema, Trajectory
from memorywalker.render.types import message_to_hf
from memorywalker.rollout import ENVIRONMENTS
from memorywalker.rollout.environments.base import Environment, StepResult
from memorywalker.samplers.base import PolicyOutput, PolicyRequest

TRANSFORM, VERSION = "augment", "1"

_VERBS = ["find", "fetch", "load", "scan", "probe", "locate", "pull", "emit", "post", "send", "seek", "view"]
_NOUNS = ["doc", "item", "entry", "record", "source", "resource", "reply", "result", "node", "web"]
_ARG_NOUNS = ["term", "ref", "key", "handle", "body", "value", "slug", "input", "phrase", "target"]
_ARG_SUFFIX = ["str", "arg", "val", "in", "spec"]
_DISTRACTORS = [
    ("translate_string", "Translate a string into another language.", {"source": "string", "lang": "string"}),
    ("get_weather", "Current weather for a city.", {"city_name": "string", "units": "string"}),
    ("send_email", "Send an email message.", {"to": "string", "subject": "string", "body": "string"}),
    ("run_python", "Execute a Python snippet and return stdout.", {"code": "string", "timeout": "integer"}),
    ("convert_units", "Convert a quantity between units.", {"amount": "number", "unit_from": "string",
                                                             "unit_to": "string"}),
    ("list_calendar", "List calendar events on a date.", {"date": "string"}),
]


@dataclass
class SchemaMap:
    """One renamed interface: ``words`` maps every old identifier (tool or argument name) to its new one."""

    seed: int
    words: dict[str, str]  # old identifier -> new identifier (one name per word, tools and arguments alike)
    dropped: dict[str, str] = field(default_factory=dict)  # old tool name -> its removed optional argument
    distractors: list[ToolSchema] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # declaration order of the new tool table (new names)
    tools: list[ToolSchema] = field(default_factory=list)  # the new tool table

    def __post_init__(self) -> None:
        self._old = _word_re(self.words)
        self._new = _word_re({v: k for k, v in self.words.items()})

    def rewrite_text(self, text: str) -> str:
        """Every whole-word, case-sensitive mention of an old identifier replaced by the new one."""
        return self._old.sub(lambda m: self.words[m.group(0)], text) if self.words else text

    def restore_text(self, text: str) -> str:
        back = {v: k for k, v in self.words.items()}
        return self._new.sub(lambda m: back[m.group(0)], text) if self.words else text

    def rewrite_json(self, value: Any, *, restore: bool = False) -> Any:
        """``value`` (JSON: dicts, lists, strings, numbers) with every key and string rewritten."""
        f = self.restore_text if restore else self.rewrite_text
        if isinstance(value, str):
            return f(value)
        if isinstance(value, dict):
            return {f(k) if isinstance(k, str) else k: self.rewrite_json(v, restore=restore) for k, v in value.items()}
        if isinstance(value, list):
            return [self.rewrite_json(v, restore=restore) for v in value]
        return value

    def rewrite_arguments(self, tool: str, arguments: dict[str, Any] | str) -> dict[str, Any] | str:
        """A call's arguments under the new interface: keys renamed, the removed argument dropped."""
        if not isinstance(arguments, dict):
            return self.rewrite_text(arguments)
        drop = self.dropped.get(tool)
        return {self.words.get(k, k): self.rewrite_json(v) for k, v in arguments.items() if k != drop}


def _word_re(words: dict[str, str]) -> re.Pattern:
    alts = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) or "(?!)"
    return re.compile(rf"(?<![\w-])(?:{alts})(?![\w-])")


def make_schema_map(tools: list[ToolSchema], seed: int, *, distractors: int = 2, reorder: bool = True,
                    drop_optional: bool = True, reserved: set[str] | None = None) -> SchemaMap:
    """A seeded renaming and restructuring of ``tools`` (the environment's own tools, not the harness's)."""
    rng = random.Random(f"augment-{seed}")
    old = {t.name for t in tools} | {k for t in tools for k in (t.parameters.get("properties") or {})}
    taken = set(old) | set(reserved or ())
    words: dict[str, str] = {}

    def fresh(parts: list[list[str]]) -> str:
        while True:
            name = "_".join(rng.choice(p) for p in parts)
            if name not in taken:
                taken.add(name)
                return name

    for t in tools:
        if t.name not in words:
            words[t.name] = fresh([_VERBS, _NOUNS])
        for k in t.parameters.get("properties") or {}:
            if k not in words:
                words[k] = fresh([_ARG_NOUNS, _ARG_SUFFIX])
    dropped: dict[str, str] = {}
    if drop_optional:
        for t in tools:
            optional = [k for k in (t.parameters.get("properties") or {}) if k not in t.parameters.get("required", [])]
            if optional:
                dropped[t.name] = rng.choice(optional)
    pool = [d for d in _DISTRACTORS if d[0] not in taken and not set(d[2]) & old]
    extra = []
    for name, desc, props in rng.sample(pool, min(distractors, len(pool))):
        extra.append(ToolSchema(name=name, description=desc, parameters={
            "type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": [next(iter(props))]}))
    m = SchemaMap(seed, words, dropped, extra)
    new = [_rename_tool(m, t, rng, reorder) for t in tools] + extra
    if reorder:
        rng.shuffle(new)
    m.tools, m.order = new, [t.name for t in new]
    return m


def _rename_tool(m: SchemaMap, t: ToolSchema, rng: random.Random, reorder: bool) -> ToolSchema:
    params = dict(t.parameters)
    props = {k: v for k, v in (params.get("properties") or {}).items() if k != m.dropped.get(t.name)}
    items = [(m.words[k], m.rewrite_json(v)) for k, v in props.items()]
    if reorder:
        rng.shuffle(items)
    params["properties"] = dict(items)
    if "required" in params:
        params["required"] = [m.words[k] for k in params["required"] if k in props]
    rest = {k: m.rewrite_json(v) for k, v in params.items() if k not in ("properties", "required")}
    fields = list({**rest, "properties": params["properties"],
                   **({"required": params["required"]} if "required" in params else {})}.items())
    if reorder:
        rng.shuffle(fields)  # the parameters object's own field order (type / properties / required)
    return ToolSchema(name=m.words[t.name], description=m.rewrite_text(t.description), parameters=dict(fields))


# --- the environment's adapter ---------------------------------------------------------------------------

class AugmentedEnv(Environment):
    """``env`` behind the renamed interface of ``schema_map``: renamed tools in, rewritten text out."""

    def __init__(self, env: Environment, schema_map: SchemaMap):
        self.env, self.map = env, schema_map
        self.name = env.name
        self.system_prompt = schema_map.rewrite_text(env.system_prompt)
        self.suites = env.suites
        self._back = {v: k for k, v in schema_map.words.items()}
        self._distractors = {t.name for t in schema_map.distractors}

    def tools(self) -> list[ToolSchema]:
        return list(self.map.tools)

    def task(self, suite: str, index: int) -> Task:
        return rewrite_task(self.env.task(suite, index), self.map)

    def reset(self, task: Task) -> str:
        return self.map.rewrite_text(self.env.reset(rewrite_task(task, self.map, restore=True)))

    def step(self, name: str, arguments: dict[str, Any]) -> StepResult:
        if name in self._distractors:
            return StepResult(f"Error: {name} is not available for this task.")
        old = self._back.get(name, name if name not in self.map.words else f"{name}?")
        if isinstance(arguments, dict):
            arguments = {self._back.get(k, k if k not in self.map.words else f"{k}?"): v for k, v in arguments.items()}
            arguments = self.map.rewrite_json(arguments, restore=True)
        r = self.env.step(old, arguments)
        return StepResult(self.map.rewrite_text(r.observation), r.done, r.reward,
                          self.map.rewrite_json(r.info))

    def expert(self) -> RenamedPolicy:
        return RenamedPolicy(self.env.expert(), self.map)  # the wrapped environment's, through the new names

    def config(self) -> dict[str, Any]:
        return {**self.map.rewrite_json(self.env.config()), "augment": {"seed": self.map.seed}}


def rewrite_task(task: Task, m: SchemaMap, *, restore: bool = False) -> Task:
    """``task`` with its question (``group`` and ``meta``) in the new names (or back, ``restore``); split kept."""
    return task.model_copy(update={"meta": m.rewrite_json(task.meta, restore=restore),
                                   "group": m.rewrite_json(task.group, restore=restore)})


class RenamedPolicy:
    """A policy written for the original interface, acting through the renamed one (the scripted expert
    on augmented tasks): it sees the original names and text, its calls are renamed on the way out."""

    def __init__(self, policy, schema_map: SchemaMap):
        self.policy, self.map = policy, schema_map
        self.name = getattr(policy, "name", "policy")
        self._back = {v: k for k, v in schema_map.words.items()}

    def config(self) -> dict[str, Any]:
        return {**self.policy.config(), "renamed": self.map.seed}

    def start(self, task: Task) -> None:
        self.policy.start(rewrite_task(task, self.map, restore=True))

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        msgs = [m.model_copy(update={"content": self.map.restore_text(m.content)}) for m in request.messages]
        tools = [self._back.get(t, t) for t in request.tools]
        out = self.policy(PolicyRequest(request.prompt_ids, msgs, tools, request.purpose, request.call_index,
                                        request.seed))
        if out.message is None:
            return out
        calls = [tc.model_copy(update={"name": self.map.words.get(tc.name, tc.name),
                                       "arguments": self.map.rewrite_arguments(tc.name, tc.arguments)})
                 for tc in out.message.tool_calls]
        msg = out.message.model_copy(update={"content": self.map.rewrite_text(out.message.content),
                                             "tool_calls": calls})
        return PolicyOutput(message=msg, finish_reason=out.finish_reason)


# --- records ---------------------------------------------------------------------------------------------

def augment_record(parent: Trajectory, m: SchemaMap, *, index: int = 0, env: Environment | None = None) -> Trajectory:
    """``parent`` under the interface of ``m`` (a derived record, checked: no old identifier survives).

    A call that used the removed optional argument gets a fresh observation from ``env`` (an
    :class:`AugmentedEnv`), since its result may change; without ``env`` such a record is refused.
    """
    env_tools = {old for old in m.words if old in {t.name for t in parent.tools}}
    answers_of: dict[str, str] = {}  # tool_call_id -> fresh observation
    messages = []
    for msg in parent.messages:
        calls = []
        for tc in msg.tool_calls:
            args = tc.arguments
            if isinstance(args, dict) and m.dropped.get(tc.name) in args:
                if env is None:
                    raise InputError(f"{parent.id}: call {tc.id} uses the removed argument "
                                     f"{m.dropped[tc.name]!r}; pass the environment for a fresh observation")
                new_args = m.rewrite_arguments(tc.name, args)
                answers_of[tc.id] = env.step(m.words[tc.name], new_args).observation
            calls.append(tc.model_copy(update={"name": m.words.get(tc.name, tc.name) if tc.name in env_tools
                                               else tc.name, "arguments": m.rewrite_arguments(tc.name, args)}))
        content = answers_of.get(msg.tool_call_id, None) if msg.role == "tool" else None
        messages.append(msg.model_copy(update={
            "content": content if content is not None else m.rewrite_text(msg.content),
            "reasoning": None if msg.reasoning is None else m.rewrite_text(msg.reasoning),
            "tool_calls": calls,
            "name": None if msg.name is None else m.words.get(msg.name, msg.name),
            "meta": m.rewrite_json(msg.meta)}))
    harness_tools = [t for t in parent.tools if t.name not in env_tools]
    calls = [c.model_copy(update={
        "tools": None if c.tools is None else _offered(c.tools, env_tools, m),
        "context_tokens": None, "response_tokens": None, "rollout_logprobs": None, "rollout_top_logprobs": None,
        "meta": m.rewrite_json(c.meta)}) for c in parent.calls]
    evictions = [e.model_validate(m.rewrite_json(e.model_dump(mode="json"))) for e in parent.evictions]
    child = derive(parent, TRANSFORM, VERSION, index=index, messages=messages, calls=calls, evictions=evictions,
                   tools=[*m.tools, *harness_tools],
                   task=None if parent.task is None else rewrite_task(parent.task, m),
                   outcome=m.rewrite_json(parent.outcome),
                   meta={**m.rewrite_json(parent.meta), "augment": {"seed": m.seed, "distractors": len(m.distractors),
                                                                    "dropped": len(m.dropped)}})
    check_no_old_identifiers(child, m)
    return child


def _offered(tools: list[str], env_tools: set[str], m: SchemaMap) -> list[str]:
    """A call's offered tools: env tools in the new declaration order (with the distractors), then the rest."""
    return [*m.order, *(t for t in tools if t not in env_tools)] if env_tools & set(tools) else list(tools)


def record_strings(traj: Trajectory) -> list[str]:
    """Every string of a record and every key of its free-form dicts (meta, outcome, arguments, JSON schemas),
    except its parent's id (``lineage.parent``). Field names of the record schema itself are structure."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, BaseModel):
            for name in type(v).model_fields:
                if not (v is traj.lineage and name == "parent"):
                    walk(getattr(v, name))
        elif isinstance(v, dict):
            for k, x in v.items():
                out.append(str(k))
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)

    walk(traj)
    return out


def surviving_identifiers(traj: Trajectory, m: SchemaMap) -> list[str]:
    """``'open' in messages...`` style findings: old identifiers found anywhere in ``traj``."""
    pattern = _word_re(m.words)
    found = set()
    for s in record_strings(traj):
        found.update(pattern.findall(s))
    return sorted(found)


def check_no_old_identifiers(traj: Trajectory, m: SchemaMap) -> None:
    """Refuse a derived record in which an old identifier survives anywhere."""
    found = surviving_identifiers(traj, m)
    if found:
        raise InputError(f"{traj.id}: old identifier(s) {', '.join(found)} survive in the augmented record")


def render_tokens(traj: Trajectory, tokenizer) -> int:
    """Tokens of the whole transcript with its tool table (what the expansion ratio compares)."""
    tools = [{"type": "function", "function": t.model_dump(mode="json")} for t in traj.tools] or None
    text = tokenizer.apply_chat_template([message_to_hf(x) for x in traj.messages], tools=tools, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def env_tools_of(traj: Trajectory) -> list[ToolSchema]:
    """The environment's own tools of a recorded episode (the harness's are not renamed)."""
    name = (traj.meta.get("env") or {}).get("name")
    if name not in ENVIRONMENTS:
        raise InputError(f"{traj.id}: environment {name!r} unknown; valid: {', '.join(ENVIRONMENTS)}")
    cfg = {k: v for k, v in traj.meta["env"].items() if k != "name"}
    return ENVIRONMENTS[name](**cfg).tools()


def augment_file(src, out, *, copies: int = 1, seed: int = 0, distractors: int = 2, tokenizer=None,
                 progress: bool = False) -> dict[str, Any]:
    """Write ``copies`` augmented records of every record of ``src`` to ``out``; return the counts and, with
    ``tokenizer``, the token expansion ratio (derived tokens / parent tokens, over the records written)."""
    parents = list(TrajectoryReader(src))
    children, rejected, tok_parent, tok_child = [], [], 0, 0
    for p in tqdm(parents, desc="augment", unit="rec", disable=not progress):
        tools = env_tools_of(p)
        for k in range(copies):
            m = make_schema_map(tools, seed * 1000 + k, distractors=distractors)
            try:
                c = augment_record(p, m, index=k)
            except ValueError as e:
                rejected.append(str(e))
                continue
            children.append(c)
            if tokenizer is not None:
                tok_parent += render_tokens(p, tokenizer)
                tok_child += render_tokens(c, tokenizer)
    write_trajectories(out, children)
    return {"parents": len(parents), "written": len(children), "rejected": len(rejected),
            "reasons": rejected[:5], "token_expansion": tok_child / tok_parent if tok_parent else None}

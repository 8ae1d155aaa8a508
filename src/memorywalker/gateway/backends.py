"""Who writes the gateway's responses, by name: ``hf`` | ``vllm`` | ``openai:URL[,URL...]`` | ``scripted:FILE``.

Each backend takes a :class:`Pending` call (the prompt's token ids exactly as rendered, the messages
and tools they came from, a limit and a seed) and returns a
:class:`~memorywalker.samplers.base.PolicyOutput` with the response's token ids and the logprobs they
were sampled (or, scripted, scored) with. Model backends use the samplers of
:mod:`memorywalker.samplers`; a backend runs one call at a time unless ``concurrent``. ``openai:`` with
several URLs (``vllm serve`` processes) is a fleet (:class:`~memorywalker.samplers.vllm_server.ServerFleet`):
each session's calls go to one server, every session's calls in flight at once.

``scripted:FILE`` plays a script, because a tiny model cannot drive a harness and a script can.
The file (YAML or JSON)::

    steps:            # played in order, per session, one per agent call (offering tools) no rule answers
      - tool_calls: [{name: Read, arguments: {file_path: "{cwd}/notes.txt"}}]
      - text: "Done."
    rules:            # answer every call they match, in any session, each time it comes
      - match: {last_user: "summary of the conversation"}   # regexes: last_user | system | any
        text: "Summary: read notes.txt, ran ls."

``{cwd}`` is the working directory the harness states in its prompt (Claude Code's and OpenCode's
``Working directory: ...``, Codex's ``<cwd>...</cwd>``). The response is the scripted message
rendered by the model's chat template (so it parses back to itself), and its logprobs are the model's,
teacher-forced: the records of a scripted session carry ``rollout_logprobs`` and its gap is measurable.
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from memorywalker.errors import InputError
from memorywalker.records.schema import Message, ToolCall, ToolSchema
from memorywalker.render.render import Renderer
from memorywalker.render.types import message_to_hf, schemas_to_hf
from memorywalker.samplers.base import PolicyOutput, PolicyRequest
from memorywalker.samplers.hf import HFPolicy
from memorywalker.samplers.openai import OpenAIPolicy
from memorywalker.samplers.vllm import VLLMPolicy
from memorywalker.samplers.vllm_server import ServerFleet

SPECS = "hf | vllm | openai:URL[,URL...] | scripted:FILE"


@dataclass
class Pending:
    session: str
    prompt_ids: list[int]
    prompt_text: str
    messages: list[Message]
    tools: list[ToolSchema]
    max_new_tokens: int
    seed: int
    purpose: str = "act"


class Backend(Protocol):
    name: str
    concurrent: bool  # may calls run at once (a remote server), or one at a time (a model in this process)

    def sample(self, call: Pending) -> PolicyOutput: ...


class SamplerBackend:
    """A sampler of :mod:`memorywalker.samplers` (``hf``, ``vllm``, ``openai:URL``) behind the gateway."""

    def __init__(self, name: str, policy: Any, *, concurrent: bool):
        self.name, self.policy, self.concurrent = name, policy, concurrent
        self._lock = threading.Lock()

    def sample(self, call: Pending) -> PolicyOutput:
        with self._lock if not self.concurrent else contextlib.nullcontext():
            return self.policy(PolicyRequest(prompt_ids=call.prompt_ids, messages=call.messages,
                                             tools=[t.name for t in call.tools], purpose=call.purpose,
                                             call_index=0, seed=call.seed, max_new_tokens=call.max_new_tokens))


class FleetBackend:
    """``openai:URL[,URL...]``: a :class:`~memorywalker.samplers.vllm_server.ServerFleet`, a session's calls
    on the server it was pinned to, no lock (the servers batch what is in flight)."""

    concurrent = True

    def __init__(self, fleet: ServerFleet):
        self.fleet, self.policy = fleet, fleet
        self.name = "openai:" + ",".join(s.url for s in fleet.servers)

    def sample(self, call: Pending) -> PolicyOutput:
        return self.fleet.sample(call.session, PolicyRequest(
            prompt_ids=call.prompt_ids, messages=call.messages, tools=[t.name for t in call.tools],
            purpose=call.purpose, call_index=0, seed=call.seed, max_new_tokens=call.max_new_tokens))


# --- scripted -----------------------------------------------------------------------------------------

_CWD = re.compile(r"Working directory: (\S+)|<cwd>([^<]+)</cwd>")


@dataclass
class Scripted:
    """A parsed script: ``steps`` played in order per session, ``rules`` matched on every call."""

    steps: list[dict[str, Any]]
    rules: list[dict[str, Any]]

    @classmethod
    def load(cls, path: str | Path) -> Scripted:
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise InputError(f"{path}: not YAML/JSON: {' '.join(str(e).split())}") from None
        if not isinstance(data, dict) or not isinstance(data.get("steps", []), list):
            raise InputError(f"{path}: a script is a mapping with a 'steps' list (and optional 'rules')")
        steps, rules = data.get("steps") or [], data.get("rules") or []
        for where, entry in [*((f"steps[{i}]", s) for i, s in enumerate(steps)),
                             *((f"rules[{i}]", r) for i, r in enumerate(rules))]:
            if not isinstance(entry, dict) or not ({"text", "tool_calls"} & entry.keys()):
                raise InputError(f"{path}: {where} needs 'text' and/or 'tool_calls'")
            for j, tc in enumerate(entry.get("tool_calls") or []):
                if not isinstance(tc, dict) or not isinstance(tc.get("name"), str) \
                        or not isinstance(tc.get("arguments", {}), dict):
                    raise InputError(f"{path}: {where}.tool_calls[{j}] needs a 'name' and an 'arguments' mapping")
        for i, r in enumerate(rules):
            unknown = set(r.get("match") or {}) - {"last_user", "system", "any"}
            if not r.get("match") or unknown:
                raise InputError(f"{path}: rules[{i}].match needs last_user, system or any (got {sorted(unknown)})")
        return cls(steps, rules)

    def entry_for(self, messages: list[Message], played: int, tools: bool = True) -> tuple[dict[str, Any], bool]:
        """(the entry answering this call, whether it is the session's next step). Steps answer agent calls
        (those offering tools); a call no rule matches that offers none gets a plain "OK"."""
        texts = {"last_user": next((m.content for m in reversed(messages) if m.role == "user"), ""),
                 "system": "\n".join(m.content for m in messages if m.role == "system"),
                 "any": "\n".join(m.content for m in messages)}
        for rule in self.rules:
            if all(re.search(pattern, texts[field], re.S) for field, pattern in rule["match"].items()):
                return rule, False
        if not tools:  # a side call (a title, a quota probe): no step is spent on it
            return {"text": "OK"}, False
        if played < len(self.steps):
            return self.steps[played], True
        return {"text": "(the script has no more steps)"}, False


def _fill(value: Any, cwd: str) -> Any:
    if isinstance(value, str):
        return value.replace("{cwd}", cwd)
    if isinstance(value, dict):
        return {k: _fill(v, cwd) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, cwd) for v in value]
    return value


class ScriptedBackend:
    """Plays a :class:`Scripted` per session; scores each response under ``scorer`` (an HF sampler)."""

    name = "scripted"
    concurrent = False

    def __init__(self, script: Scripted, renderer: Renderer, scorer):
        self.script, self.renderer, self.scorer = script, renderer, scorer
        self.played: dict[str, int] = {}
        self._lock = threading.Lock()

    def response_ids(self, call: Pending, entry: dict[str, Any]) -> list[int]:
        """The scripted message as the chat template renders it after the context, through its end-of-turn token."""
        found = _CWD.search("\n".join(m.content for m in call.messages))
        cwd = (found.group(1) or found.group(2)).strip() if found else "."
        message = Message(id="response", role="assistant", content=_fill(entry.get("text") or "", cwd),
                          reasoning=entry.get("reasoning") or None,
                          tool_calls=[ToolCall(id=f"script-{k}", name=tc["name"], arguments=_fill(tc.get("arguments") or {}, cwd))
                                      for k, tc in enumerate(entry.get("tool_calls") or [])])
        tok = self.renderer.tok
        full = tok.apply_chat_template([message_to_hf(m) for m in [*call.messages, message]],
                                       tools=schemas_to_hf(call.tools), tokenize=False, add_generation_prompt=False)
        if not full.startswith(call.prompt_text):
            raise InputError("the chat template does not render the scripted response as a suffix of the prompt")
        ids = tok(full[len(call.prompt_text):], add_special_tokens=False)["input_ids"]
        end = next((i for i, t in enumerate(ids) if t in self.renderer.eot_ids), len(ids) - 1)
        return ids[: end + 1]

    def sample(self, call: Pending) -> PolicyOutput:
        with self._lock:
            entry, is_step = self.script.entry_for(call.messages, self.played.get(call.session, 0), bool(call.tools))
            if is_step:
                self.played[call.session] = self.played.get(call.session, 0) + 1
            ids = self.response_ids(call, entry)
            finish = "stop"
            if len(ids) > call.max_new_tokens:
                ids, finish = ids[: call.max_new_tokens], "length"
            return PolicyOutput(token_ids=ids, logprobs=self.scorer.score(call.prompt_ids, ids), finish_reason=finish,
                                meta={"scripted": "step" if is_step else "rule"})


def make_backend(spec: str, *, model_dir: str | None, renderer: Renderer, temperature: float, dtype: str = "float32",
                 max_new_tokens: int = 512, model=None, max_positions: int = 8192,
                 upstream_model: str | None = None) -> Backend:
    """``hf`` | ``vllm`` | ``openai:URL`` | ``scripted:FILE`` → a backend serving ``model_dir``'s model.

    ``upstream_model``: the model name an ``openai:URL`` server serves (``vllm serve``'s
    ``--served-model-name``; by default the directory it was started with)."""
    kind, _, arg = spec.partition(":")
    stop = sorted(renderer.eot_ids)
    if kind in ("hf", "scripted") and not (kind == "hf" and arg):
        if model is not None:
            policy = HFPolicy.from_model(model, renderer.tok, temperature=temperature, stop_ids=stop,
                                         max_new_tokens=max_new_tokens)
        else:
            policy = HFPolicy(model_dir, tokenizer=renderer.tok, temperature=temperature, dtype=dtype, stop_ids=stop,
                              max_new_tokens=max_new_tokens)
        if kind == "hf":
            return SamplerBackend("hf", policy, concurrent=False)
        if not arg:
            raise InputError(f"scripted needs a script file: scripted:FILE ({SPECS})")
        return ScriptedBackend(Scripted.load(arg), renderer, policy)
    if kind == "vllm" and not arg:
        policy = VLLMPolicy(model_dir, temperature=temperature, max_new_tokens=max_new_tokens, dtype=dtype, stop_ids=stop,
                            tokenizer=renderer.tok, max_model_len=max_positions)
        return SamplerBackend("vllm", policy, concurrent=False)
    if kind == "openai" and arg:
        urls = [u for u in arg.split(",") if u]
        if len(urls) > 1:
            return FleetBackend(ServerFleet(urls, model=upstream_model or model_dir or "default", temperature=temperature,
                                            stop_ids=stop, max_new_tokens=max_new_tokens))
        policy = OpenAIPolicy(arg, model=upstream_model or model_dir or "default", temperature=temperature, stop_ids=stop,
                              max_new_tokens=max_new_tokens, retries=0)
        return SamplerBackend(f"openai:{arg}", policy, concurrent=True)
    raise InputError(f"unknown backend {spec!r}; valid: {SPECS}")

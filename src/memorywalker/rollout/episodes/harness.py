"""The harness loop: render, call the policy, parse tool calls, execute them, compress, record.

One episode::

    env = WebSearchEnv(world_seed=0)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    traj = run_episode(env, env.task("chain", 3), ExpertPolicy(), tok, HarnessConfig("claude-code"), seed=0)

Before every act call the compression policy may rewrite the history (recording each rewrite as a
white-box :class:`~memorywalker.records.schema.Eviction`, and any summarization call as a
:class:`~memorywalker.records.schema.Call` with ``purpose`` ``summarize``/``fold``). The context is
rendered with the tokenizer's chat template (tool schemas in the prompt) exactly like
:class:`~memorywalker.render.Renderer` renders it, and those token ids are what the policy receives and
what the call records as ``context_tokens``.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.builder import TrajectoryBuilder
from memorywalker.records.schema import Lineage, Message, Task, ToolCall, ToolSchema, Trajectory
from memorywalker.records.validate import RecordError
from memorywalker.render.render import eot_ids
from memorywalker.render.tool_formats import CALL_HINTS, FORMATS, by_schema, format_for
from memorywalker.render.toolcalls import call_arguments
from memorywalker.render.types import message_to_hf
from memorywalker.rollout.compressors import Compressor, apply_eviction, make_compressor
from memorywalker.rollout.environments.base import Environment
from memorywalker.samplers.base import Policy, PolicyRequest


@dataclass
class HarnessConfig:
    """How a rollout manages its context. Budgets are in tokens of the rendered prompt."""

    name: str = "none"  # compression policy: none | claude-code | opencode | agentfold | memex | tc-rag | qwen-agent
    budget: int = 2048  # context budget the compression policy keeps the history under
    watermark: float = 0.8  # claude-code/opencode/agentfold/memex compress above watermark * budget
    keep_recent: int = 1  # most recent steps protected from placeholders, folding and offloading
    max_steps: int = 32  # act calls per episode
    max_context: int = 8192  # hard window: an act call whose prompt is longer ends the episode
    placeholder: str = "[Old tool result content cleared]"  # opencode's fixed placeholder text
    max_fold_blocks: int = 2  # agentfold: fold blocks kept before they are consolidated into one
    min_truncated_tokens: int = 48  # qwen-agent: below this, a tool result is dropped rather than truncated
    tool_parser: str | None = None  # the sampled tool-call format (render/tool_formats.py); None: the template's

    def __post_init__(self) -> None:
        make_compressor(self.name)  # raises with the valid names
        if self.tool_parser is not None and self.tool_parser not in FORMATS:
            raise InputError(f"tool_parser={self.tool_parser}: not a known tool-call format ({', '.join(FORMATS)})")
        if not 0 < self.watermark <= 1:
            raise InputError(f"watermark must be in (0, 1], got {self.watermark}")

    @classmethod
    def of(cls, settings: Any) -> HarnessConfig:
        """The harness of a command's or recipe's config (``EvalConfig``, ``DaggerConfig``): its ``compressor``
        and whichever of this class's fields it also has, under the same names (the rest keep their defaults).

        >>> from types import SimpleNamespace
        >>> h = HarnessConfig.of(SimpleNamespace(compressor="opencode", budget=512, max_steps=6, seed=3))
        >>> h.name, h.budget, h.max_steps, h.max_context == HarnessConfig.max_context
        ('opencode', 512, 6, True)
        """
        given = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name != "name" and hasattr(settings, f.name)}
        return cls(settings.compressor, **given)


def call_seed(seed: int, *parts: Any) -> int:
    """A 63-bit seed derived from ``seed`` and ``parts`` (stable across processes, unlike hash())."""
    h = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


class Episode:
    """State of one rollout; compression policies read and rewrite ``history`` through its methods."""

    def __init__(self, env: Environment, task: Task, policy: Policy, tokenizer, config: HarnessConfig, *,
                 seed: int, episode_id: str, compressor: Compressor | None = None, meta: dict | None = None):
        self.env, self.task, self.policy, self.tok, self.config = env, task, policy, tokenizer, config
        self.seed = seed
        self.compressor = compressor or make_compressor(config.name)
        tools: list[ToolSchema] = [*env.tools(), *self.compressor.tools()]
        self.tool_names = [t.name for t in tools]
        self.hf_tools = [{"type": "function", "function": t.model_dump(mode="json")} for t in tools] or None
        self.b = TrajectoryBuilder(episode_id, task=task, tools=tools,
                                   lineage=Lineage(source="rollout"), meta=dict(meta or {}))
        self.table: dict[str, Message] = {}
        self.history: list[str] = []
        self.pending_evictions: list[dict[str, Any]] = []
        self.current_response: str | None = None
        self._n_tool_calls = 0
        self._token_memo: dict[tuple[str, ...], tuple[str, list[int]]] = {}
        self.eot_ids = eot_ids(tokenizer)
        self.tool_format = config.tool_parser or format_for(getattr(tokenizer, "chat_template", None))

    # --- messages -----------------------------------------------------------------------------------

    def add(self, role: str, content: str = "", *, author: str, **fields: Any) -> str:
        mid = self.b.message(role, content, author=author, **fields)
        self.table[mid] = self.b.messages[-1]
        return mid

    def add_artifact(self, role: str, content: str, **fields: Any) -> str:
        """A compression artifact: text the harness inserts (summary, placeholder, memory key)."""
        return self.add(role, content, author="harness", **fields)

    def msg(self, mid: str) -> Message:
        return self.table[mid]

    def steps(self) -> list[list[str]]:
        """The history after system + task, split into steps (an assistant turn or an artifact block,
        with the observations that follow it)."""
        steps: list[list[str]] = []
        for mid in self.history[2:]:
            m = self.table[mid]
            if m.role == "assistant" or (m.is_artifact and m.role == "user") or not steps:
                steps.append([mid])
            else:
                steps[-1].append(mid)
        return steps

    # --- tokens -------------------------------------------------------------------------------------

    def render(self, ids: list[str]) -> tuple[str, list[int]]:
        """Prompt text and token ids of a context, exactly as :class:`Renderer` renders it."""
        key = tuple(ids)
        if key not in self._token_memo:
            text = self.tok.apply_chat_template([message_to_hf(self.table[i]) for i in ids], tools=self.hf_tools,
                                                tokenize=False, add_generation_prompt=True)
            self._token_memo[key] = (text, self.encode(text))
        return self._token_memo[key]

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def tokens(self, ids: list[str]) -> int:
        return len(self.render(ids)[1])

    def rough_tokens(self, m: Message) -> int:
        """Content tokens of one message (arguments included), the way Qwen-Agent counts them roughly."""
        text = m.content + "".join(f"{tc.name}{tc.arguments}" for tc in m.tool_calls)
        return len(self.encode(text))

    def truncate_both_sides(self, text: str, max_tokens: int) -> str:
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text
        marker = self.encode("\n...\n")
        head = (max_tokens - len(marker)) // 2
        tail = max_tokens - len(marker) - head
        return self.tok.decode(ids[:head]) + "\n...\n" + (self.tok.decode(ids[-tail:]) if tail > 0 else "")

    # --- evictions ----------------------------------------------------------------------------------

    def evict(self, kind: str, removed: list[str], replaces: dict[str, list[str]], *, trigger: str,
              tokens_before: int | None = None, meta: dict[str, Any] | None = None) -> None:
        self.history = apply_eviction(self.history, removed, replaces)
        inserted = [mid for mid in self.history if mid in replaces]
        self.pending_evictions.append(dict(kind=kind, removed=list(removed), inserted=inserted, trigger=trigger,
                                           tokens_before=tokens_before, tokens_after=self.tokens(self.history),
                                           meta={**(meta or {}), "policy": self.config.name,
                                                 "replaces": {k: list(v) for k, v in replaces.items()}}))

    def _flush_evictions(self, call_id: str) -> None:
        for ev in self.pending_evictions:
            self.b.eviction(call_id, **ev)
        self.pending_evictions = []

    # --- calls --------------------------------------------------------------------------------------

    def call(self, context: list[str], purpose: str) -> tuple[str, str, list[tuple[str, dict | str]], str | None]:
        """One model call on ``context``; returns (response id, response text, tool calls, parse error)."""
        call_id = f"call-{len(self.b.calls)}"
        self._flush_evictions(call_id)
        prompt_text, prompt_ids = self.render(context)
        request = PolicyRequest(prompt_ids=list(prompt_ids), messages=[self.table[i] for i in context],
                                tools=list(self.tool_names), purpose=purpose, call_index=len(self.b.calls),
                                seed=call_seed(self.seed, len(self.b.calls)))
        out = self.policy(request)
        error = None
        if out.message is not None:  # scripted: render its message to get the response tokens
            m = out.message
            calls = [(tc.name, tc.arguments) for tc in m.tool_calls]
            text = m.content
            resp = self._response_message(m.content, calls, m.reasoning)
            full = self.tok.apply_chat_template([*request_hf(request), message_to_hf(resp)], tools=self.hf_tools,
                                                tokenize=False, add_generation_prompt=False)
            response_ids = self._cut(self.encode(full[len(prompt_text):]))
            logprobs = tops = None
            finish = "tool_calls" if calls else "stop"
        else:
            response_ids = list(out.token_ids or [])
            self._check_vocab(response_ids, out.top_logprobs)
            ended = bool(response_ids) and response_ids[-1] in self.eot_ids
            text = self.tok.decode(response_ids[:-1] if ended else response_ids)
            candidates = by_schema(FORMATS[self.tool_format][0](text), self.hf_tools)  # the template family's format
            calls, error, resp = [], candidates[0].error, None
            for c in candidates if error is None else []:
                taken = self._n_tool_calls
                resp = self._response_message(c.content, c.tool_calls)
                if self._renders_as(request, prompt_text, resp, text):
                    calls = c.tool_calls
                    break
                self._n_tool_calls = taken  # a reading that does not re-render takes no tool-call ids
            else:  # none: the template would not reproduce the sampled text: keep it verbatim as content
                if error is None:
                    error = "tool call does not re-render as sampled"
                resp = self._response_message(text, [])
            logprobs, tops = out.logprobs, out.top_logprobs
            finish = "length" if out.finish_reason == "length" else ("tool_calls" if calls else "stop")
        rid = self.add("assistant", resp.content, author="model", tool_calls=resp.tool_calls,
                       reasoning=resp.reasoning)
        self.b.call(context, rid, tools=list(self.tool_names), context_tokens=list(prompt_ids),
                    response_tokens=response_ids, rollout_logprobs=logprobs, rollout_top_logprobs=tops,
                    finish_reason=finish, purpose=purpose, meta={"prompt_tokens": len(prompt_ids), **out.meta})
        return rid, text, calls if error is None else [], error

    def _check_vocab(self, ids: list[int], tops) -> None:
        """Sampled ids the tokenizer does not have mean the server runs another tokenizer: nothing of this
        episode is written (the ones before it are), and the run stops with one line."""
        vocab = len(self.tok)
        ids = [*ids, *(t for row in tops or [] for t, _ in row)]
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RecordError("token_out_of_vocab", f"policy {self.policy.name} returned token id {bad}, which the "
                              f"tokenizer does not have (vocab size {vocab}): is --tokenizer the served model's?")

    def _response_message(self, content: str, calls: list[tuple[str, dict | str]],
                          reasoning: str | None = None) -> Message:
        tcs = []
        for name, args in calls:
            tcs.append(ToolCall(id=f"tc{self._n_tool_calls}", name=name, arguments=args))
            self._n_tool_calls += 1
        return Message(id="", role="assistant", content=content, tool_calls=tcs, reasoning=reasoning)

    def _renders_as(self, request: PolicyRequest, prompt_text: str, resp: Message, text: str) -> bool:
        full = self.tok.apply_chat_template([*request_hf(request), message_to_hf(resp)], tools=self.hf_tools,
                                            tokenize=False, add_generation_prompt=False)
        return full[len(prompt_text):].startswith(text) and full.startswith(prompt_text)

    def _cut(self, ids: list[int]) -> list[int]:
        for i, t in enumerate(ids):
            if t in self.eot_ids:
                return ids[: i + 1]
        return ids

    def side_call(self, purpose: str, instruction: str) -> str:
        """A summarization call on the history plus a harness-authored request; returns its text."""
        req = self.add_artifact("user", instruction)
        _, text, _, _ = self.call([*self.history, req], purpose)
        return text.strip()


def request_hf(request: PolicyRequest) -> list[dict[str, Any]]:
    return [message_to_hf(m) for m in request.messages]


def run_episode(env: Environment, task: Task, policy: Policy, tokenizer, config: HarnessConfig, *, seed: int = 0,
                episode_id: str | None = None, meta: dict[str, Any] | None = None) -> Trajectory:
    """Roll out one episode of ``task`` and return its trajectory (schema v1)."""
    episode_id = episode_id or f"{task.id}-{config.name}-s{seed}"
    meta = {"env": env.config(), "harness": asdict(config), "policy": policy.config(), "seed": seed, **(meta or {})}
    ep = Episode(env, task, policy, tokenizer, config, seed=seed, episode_id=episode_id, meta=meta)
    policy.start(task)
    prompt = env.reset(task)
    ep.history = [ep.add("system", env.system_prompt, author="system"), ep.add("user", prompt, author="user")]
    reward, answer, termination, steps = 0.0, None, "max_steps", 0
    while steps < config.max_steps:
        if steps:
            ep.compressor.before_call(ep)
            if ep.tokens(ep.history) > config.max_context:
                termination = "context_overflow"
                break
        rid, _, calls, error = ep.call(list(ep.history), "act")
        ep.current_response = rid
        steps += 1
        ep.history.append(rid)
        done = False
        if error is not None:
            ep.history.append(ep.add("user", f"Error: {error}. Call a tool as {CALL_HINTS[ep.tool_format]}",
                                     author="environment"))
        for tc in ep.table[rid].tool_calls:
            extra: dict[str, Any] = {}
            args = call_arguments(tc.arguments)
            if args is None:
                obs = f"Error: the arguments of {tc.name} are not a JSON object."
            else:
                obs = ep.compressor.handle(ep, tc.name, args)
                if obs is None:
                    result = env.step(tc.name, args)
                    obs = result.observation
                    if "fault" in result.info:  # an injected fault (rollout/episodes/faults.py, opt-in) is tagged
                        extra = {"meta": {"fault": result.info["fault"]}}
                    if result.done:
                        done, reward = True, result.reward
                        answer = result.info.get("answer")
            ep.history.append(ep.add("tool", obs, author="environment", tool_call_id=tc.id, name=tc.name, **extra))
            if done:
                break
        if done:
            termination = "answered"
            break
    ep.b.reward = reward
    ep.b.outcome = {"termination": termination, "answer": answer, "correct": reward == 1.0, "steps": steps,
                    "calls": len(ep.b.calls), "evictions": len(ep.b.evictions),
                    "max_prompt_tokens": max(c.meta["prompt_tokens"] for c in ep.b.calls)}
    return ep.b.build()

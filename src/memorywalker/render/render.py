"""Verified rendering: tokenizer + chat template -> per call ``S_t`` with a role label per token.

For one call, ``S_t = tokens(prompt) ⊕ tokens(response)`` where ``prompt`` is the context rendered
with the generation prompt, exactly as an inference server tokenizes it, and the response is what the
template appends for the response message. Rendering is checked, not trusted:

* the rendered prompt must be a prefix of the rendering of context + response (the response is a
  suffix of ``S_t``); otherwise the call is unselected with reason ``response_not_suffix``;
* per-message character spans come from rendering growing prefixes of the context; each must extend
  the previous one, else spans fall back to locating each message's content (``span_method``);
* recorded token ids win over re-tokenization, and must decode to the rendered text
  (``recorded_tokens_mismatch`` otherwise).

Targets: the tokens of a selected response up to and including its authentic end-of-turn token;
the host delimiter after it (e.g. the newline after ``<|im_end|>``) is not part of ``S_t``. A
response cut off by the length limit is excluded (default) or supervised prefix-only, without a
terminator. Context tokens are never targets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from jinja2 import TemplateError

from memorywalker.records.schema import Call, Message, Trajectory
from memorywalker.render.fullview import build_full_view
from memorywalker.render.types import (
    ROLE_ID,
    RenderedCall,
    RenderedTrajectory,
    RenderError,
    message_to_hf,
    tools_to_hf,
)

# End-of-turn tokens of common chat templates, used in addition to the tokenizer's eos token.
KNOWN_EOT = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|return|>")
# Under a harmony template (gpt-oss) <|end|> closes a message inside a response (its analysis, a preamble):
# a response ends at its call or its final answer.
HARMONY_EOT = ("<|return|>", "<|call|>", "<|endoftext|>")


@dataclass
class RenderOptions:
    # "exclude": a response cut off by the length limit is not a target (its call is unselected).
    # "prefix": its tokens are targets, without a terminator the model never produced.
    truncated: Literal["exclude", "prefix"] = "exclude"
    # What to do when recorded token ids do not decode to the rendered text.
    recorded_mismatch: Literal["unselect", "keep"] = "unselect"
    # Extra end-of-turn token strings (the tokenizer's eos and KNOWN_EOT present in the vocab are used).
    eot_tokens: tuple[str, ...] = ()
    # The full view (sdcc) keeps the harness's compression artifacts (summaries, placeholders) where the
    # history first had them, instead of removing them: the uncompressed history plus what the harness added.
    full_view_artifacts: bool = False


def eot_ids(tokenizer, extra: tuple[str, ...] = ()) -> frozenset[int]:
    """End-of-turn token ids: eos, the :data:`KNOWN_EOT` tokens the tokenizer has as specials (the
    :data:`HARMONY_EOT` ones under a harmony chat template), and ``extra`` (configured ``eot_tokens``, special
    or not). The one definition the renderer, the samplers' stop ids and the compressors' episode loop share."""
    vocab, specials = tokenizer.get_vocab(), set(tokenizer.all_special_tokens)
    template = getattr(tokenizer, "chat_template", None)
    known = HARMONY_EOT if isinstance(template, str) and "<|channel|>" in template else KNOWN_EOT
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    ids -= {vocab.get("<|end|>")} if known is HARMONY_EOT else set()
    ids |= {vocab[t] for t in known if t in vocab and t in specials}
    ids |= {vocab[t] for t in extra if t in vocab}
    return frozenset(ids)


class Renderer:
    """Renders calls of trajectories with one tokenizer; memoizes prompt renderings per trajectory."""

    def __init__(self, tokenizer, options: RenderOptions | None = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise RenderError("the tokenizer has no chat template")
        self.tok = tokenizer
        self.options = options or RenderOptions()
        self.eot_ids = eot_ids(tokenizer, self.options.eot_tokens)
        # tok.decode is a fast tokenizer's Rust decode plus, when set, a clean-up of spaces; transformers'
        # wrapper first walks the ids in Python (5 ms of a 23K-token prompt), so without the clean-up the
        # Rust decoder is called directly: the same text
        fast = getattr(tokenizer, "is_fast", False) and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._rust_decode = tokenizer.backend_tokenizer.decode if fast else None
        # Special added tokens that absorb no neighbouring whitespace: the input is split at them
        # before any other tokenization step, so they are safe points to resume tokenizing from.
        self.split_tokens = {
            i: len(t.content) for i, t in tokenizer.added_tokens_decoder.items()
            if t.special and not t.lstrip and not t.rstrip
        }

    def decode(self, ids: list[int]) -> str:
        """``tok.decode(ids, skip_special_tokens=False)``, the same text, without transformers' Python walk over
        the ids where it adds nothing (see ``__init__``)."""
        if self._rust_decode is not None:
            return self._rust_decode(list(ids), skip_special_tokens=False)
        return self.tok.decode(ids, skip_special_tokens=False)

    # --- text level -------------------------------------------------------------------------------

    def _apply(self, messages: list[dict], tools, *, generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _encode(self, text: str) -> tuple[list[int], np.ndarray]:
        """Token ids and the start character of each token."""
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        return list(enc["input_ids"]), np.fromiter((o[0] for o in offsets), dtype=np.int64, count=len(offsets))

    def _encode_prompt(self, text: str, cache: _TrajectoryCache) -> tuple[list[int], np.ndarray]:
        """Tokenize a prompt, reusing the tokens of an earlier prompt that is a prefix of it.

        Tokenizers split the input at added tokens (``<|im_start|>``, ...) before anything else, so
        the tokens of ``text`` up to the end of an added token do not depend on what follows it; only
        the text after the last such token of the cached prefix is tokenized again. This keeps
        rendering a long session linear in its unique tokens rather than in Σ|S_t|.
        """
        out = None
        for prev_text, prev_ids, prev_starts in reversed(cache.prompts):
            if len(prev_text) <= len(text) and text.startswith(prev_text):
                cut = self._last_split_point(prev_ids, prev_starts)
                if cut is not None:
                    n_keep, char = cut
                    ids, starts = self._encode(text[char:])
                    out = (prev_ids[:n_keep] + ids, np.concatenate([prev_starts[:n_keep], starts + char]))
                break
        if out is None:
            out = self._encode(text)
        cache.prompts.append((text, *out))
        del cache.prompts[:-4]  # the last few prompts are the only likely prefixes
        return out

    def _last_split_point(self, ids: list[int], starts: np.ndarray) -> tuple[int, int] | None:
        """(tokens to keep, character) right after the last special added token in ``ids``."""
        for j in range(len(ids) - 1, -1, -1):
            length = self.split_tokens.get(ids[j])
            if length is not None:
                return j + 1, int(starts[j]) + length
        return None

    def message_spans(
        self, messages: list[Message], tools, prompt_text: str, cache: _TrajectoryCache | None = None
    ) -> tuple[list[tuple[int, int]], str]:
        """Character span of each message inside ``prompt_text`` and how it was found.

        Incremental rendering: message i spans ``[len(render(m[:i])), len(render(m[:i+1])))``. It is
        verified that every rendering extends the previous one and the last is a prefix of the prompt.
        Renderings of a prefix depend only on that prefix (and the tools), so the prefix shared with
        the previous call of the trajectory is taken from the cache.
        """
        cache = cache or _TrajectoryCache()
        hf = [cache.hf(m) for m in messages]
        ids = [m.id for m in messages]
        key = json.dumps(tools, sort_keys=True)
        prev_ids, prev_ends, prev_texts = cache.spans.get(key, ([], [], {}))
        lcp = 0
        for a, b in zip(ids, prev_ids, strict=False):
            if a != b:
                break
            lcp += 1
        ends = list(prev_ends[:lcp])
        try:
            prev = "" if lcp == 0 else prev_texts.get(lcp) or self._apply(hf[:lcp], tools, generation_prompt=False)
            texts = {lcp: prev}
            for i in range(lcp + 1, len(messages) + 1):
                text = self._apply(hf[:i], tools, generation_prompt=False)
                if not text.startswith(prev):
                    raise RenderError(f"rendering message {i - 1} rewrites earlier text")
                ends.append(len(text))
                prev = text
            texts[len(messages)] = prev
            if not prompt_text.startswith(prev):
                raise RenderError("the context rendering is not a prefix of the prompt")
        except (RenderError, TemplateError):
            # A template may refuse a partial conversation (raise_exception: "roles must alternate") or
            # render a prefix differently; the spans are then located by content. Anything else is a bug
            # and propagates.
            return self._search_spans(messages, prompt_text), "search"
        cache.spans[key] = (ids, ends, texts)
        starts = [0, *ends[:-1]]
        return list(zip(starts, ends, strict=True)), "incremental"

    @staticmethod
    def _search_spans(messages: list[Message], prompt_text: str) -> list[tuple[int, int]]:
        """Fallback: each message spans from the end of the previous one to the end of its content."""
        spans, pos = [], 0
        for m in messages:
            probe = m.content or (m.tool_calls[0].name if m.tool_calls else "")
            hit = prompt_text.find(probe, pos) if probe else -1
            end = hit + len(probe) if hit >= 0 else pos
            spans.append((pos, end))
            pos = end
        return spans

    # --- serving (the gateway renders each request once) -----------------------------------------

    def prompt_text(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """The context rendered with the generation prompt, as an inference server renders it."""
        return self._apply([message_to_hf(m) for m in messages], tools, generation_prompt=True)

    def response_text(self, messages: list[Message], tools: list[dict[str, Any]] | None, response: Message) -> str | None:
        """The text the template writes for ``response`` after ``messages``, without its end-of-turn token
        (None when the conversation with it does not extend the prompt): a parsed response is exact when
        this is the text the model sampled."""
        return self.response_texts(messages, tools)(response)

    def response_texts(self, messages: list[Message], tools: list[dict[str, Any]] | None, prompt: str | None = None):
        """:meth:`response_text` for many candidate responses after one context: the context is converted
        and its prompt rendered once (``prompt``: that rendering, when the caller has it already)."""
        hf = [message_to_hf(m) for m in messages]
        prompt = self._apply(hf, tools, generation_prompt=True) if prompt is None else prompt

        def text_of(response: Message) -> str | None:
            full = self._apply([*hf, message_to_hf(response)], tools, generation_prompt=False)
            if not full.startswith(prompt):
                return None
            ids, _ = self._encode(full[len(prompt):])
            return self.decode(self.strip_eot(self._cut_delimiter(ids)))

        return text_of

    def encode_continuing(self, text: str, cache: _TrajectoryCache) -> list[int]:
        """Token ids of ``text`` that keep the ids of the longest remembered sequence it extends.

        A session's next prompt usually extends the previous call's prompt plus its sampled response;
        re-tokenizing that response could give other ids than were sampled (a model may emit a
        non-canonical tokenization of its text). The remembered ids are kept up to their last special
        token (:meth:`_encode_prompt`), so what was sampled is delivered as sampled.
        """
        return self._encode_prompt(text, cache)[0]

    def remember(self, cache: _TrajectoryCache, prompt_text: str, prompt_ids: list[int], response_ids: list[int]) -> None:
        """Remember ``S_t`` (a prompt and its sampled response) for :meth:`encode_continuing`.

        Only the start characters of special added tokens are read (:meth:`_last_split_point`), so only
        theirs are computed, from the decoded prefix before each; other response tokens get the
        response's start (never a split point).
        """
        start = len(prompt_text)
        starts = np.full(len(response_ids), start, dtype=np.int64)
        for j, t in enumerate(response_ids):
            if t in self.split_tokens:
                starts[j] = start + len(self.decode(response_ids[:j]))
        text = prompt_text + self.decode(response_ids)
        last = cache.prompts[-1] if cache.prompts else None
        prompt_starts = last[2] if last is not None and last[0] == prompt_text else self._encode(prompt_text)[1]
        cache.prompts.append((text, list(prompt_ids) + list(response_ids), np.concatenate([prompt_starts, starts])))
        del cache.prompts[:-4]

    # --- one call ---------------------------------------------------------------------------------

    def render_call(self, traj: Trajectory, index: int, cache: _TrajectoryCache | None = None) -> RenderedCall:
        cache = cache or _TrajectoryCache(traj)
        call: Call = traj.calls[index]
        context = [cache.table[mid] for mid in call.context]
        response = cache.table[call.response]
        tools = tools_to_hf(traj, call.tools)
        hf_context = [cache.hf(m) for m in context]
        prompt_text = self._apply(hf_context, tools, generation_prompt=True)
        full_text = self._apply([*hf_context, cache.hf(response)], tools, generation_prompt=False)
        warnings: list[str] = []

        spans, span_method = self.message_spans(context, tools, prompt_text, cache)
        if span_method == "search":
            warnings.append("incremental rendering failed; spans located by content search")

        prompt_ids, starts = self._encode_prompt(prompt_text, cache)
        roles = _span_roles(starts, spans, context)

        reason: str | None = None
        rendered_response: list[int] | None = None
        if not full_text.startswith(prompt_text):
            reason = "response_not_suffix"
            resp_ids: list[int] = []
        else:
            resp_ids, _ = self._encode(full_text[len(prompt_text):])
            resp_ids = self._cut_delimiter(resp_ids)

        if call.context_tokens is not None:
            # Recorded ids are what the engine saw and sampled; they win over re-tokenization.
            mismatch = self._recorded_mismatch(call, prompt_ids, resp_ids)
            if mismatch:
                warnings.append(f"recorded_tokens_mismatch: {mismatch}")
                roles = [ROLE_ID["context"]] * len(call.context_tokens)
                if self.options.recorded_mismatch == "unselect" and reason is None:
                    reason = "recorded_tokens_mismatch"
            elif list(call.context_tokens) != prompt_ids:
                # Same text, other ids (a harness that tokenized differently): spans are unverified.
                warnings.append("recorded context_tokens tokenize the prompt differently")
                roles = [ROLE_ID["context"]] * len(call.context_tokens)
            rendered_response = resp_ids
            prompt_ids, resp_ids = list(call.context_tokens), list(call.response_tokens)
            span_method = "recorded" if mismatch else span_method

        tokens = prompt_ids + resp_ids
        roles = roles + [ROLE_ID["assistant"]] * len(resp_ids)
        targets, logprobs, target_reason = self._targets(call, len(prompt_ids), resp_ids)
        if reason is None:
            reason = target_reason
        if reason is not None:
            targets, logprobs = [], []
        return RenderedCall(
            index=index,
            call_id=call.id,
            tokens=tokens,
            roles=roles,
            prompt_len=len(prompt_ids),
            targets=targets,
            target_logprobs=logprobs,
            selected=call.selected and reason is None,
            reason=reason,
            span_method=span_method,
            warnings=warnings,
            rendered_response=rendered_response,
        )

    def _cut_delimiter(self, resp_ids: list[int]) -> list[int]:
        """Drop what the template appends after the end-of-turn token (a host delimiter)."""
        for i, t in enumerate(resp_ids):
            if t in self.eot_ids:
                return resp_ids[: i + 1]
        return resp_ids

    def _recorded_mismatch(self, call: Call, prompt_ids: list[int], resp_ids: list[int]) -> str | None:
        decode = self.tok.decode
        if decode(call.context_tokens) != decode(prompt_ids):
            return "context_tokens do not decode to the rendered prompt"
        recorded = list(call.response_tokens)
        if call.finish_reason == "length":
            # A cut-off response is a prefix of what the template renders for it.
            if not decode(resp_ids).startswith(decode(recorded)):
                return "response_tokens are not a prefix of the rendered response"
        elif decode(self.strip_eot(recorded)) != decode(self.strip_eot(resp_ids)):
            # The terminator may differ (a model that stops on <|endoftext|> where the template
            # writes <|im_end|>): the sampled one is authentic, the body must match.
            return "response_tokens do not decode to the rendered response"
        return None

    def strip_eot(self, ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] in self.eot_ids else ids

    def _targets(self, call: Call, prompt_len: int, resp_ids: list[int]):
        if not call.selected:
            return [], [], f"not_selected: {call.reason or 'unspecified'}"
        n = len(resp_ids)
        if call.finish_reason == "length":
            if self.options.truncated == "exclude":
                return [], [], "truncated"
            if call.response_tokens is None:
                # Re-rendered text carries a terminator the model never produced: drop it.
                while n and resp_ids[n - 1] in self.eot_ids:
                    n -= 1
        if n == 0:
            return [], [], "empty_response"
        lps = call.rollout_logprobs
        logprobs = [lps[i] if lps is not None and i < len(lps) else None for i in range(n)]
        return [prompt_len + i for i in range(n)], logprobs, None

    # --- whole trajectories -----------------------------------------------------------------------

    def render(self, traj: Trajectory, *, full_view: bool = False) -> RenderedTrajectory:
        """Every call's ``S_t``; with ``full_view`` also the uncompressed transcript (what ``sdcc`` trains on)."""
        cache = _TrajectoryCache(traj)
        rt = RenderedTrajectory(traj, [self.render_call(traj, i, cache) for i in range(len(traj.calls))])
        if full_view:
            rt.full_view = build_full_view(rt, self)
        return rt

    def render_messages(self, messages: list[Message], tools) -> tuple[list[int], list[int], list[tuple[int, int]]]:
        """Tokens, role ids and per-message token spans of a plain conversation (no generation prompt).

        Used for the full view (SDCC): the uncompressed transcript rendered as one sequence.
        """
        text = self._apply([message_to_hf(m) for m in messages], tools, generation_prompt=False)
        spans, _ = self.message_spans(messages, tools, text)
        ids, starts = self._encode(text)
        roles = _span_roles(starts, spans, messages)
        bounds = np.searchsorted(starts, np.asarray(spans, dtype=np.int64).reshape(-1), side="left")
        token_spans = [(int(a), int(b)) for a, b in bounds.reshape(-1, 2)]
        return ids, roles, token_spans


def _span_roles(starts: np.ndarray, spans: list[tuple[int, int]], messages: list[Message]) -> list[int]:
    """Role id of each token: the role of the message span its first character falls in."""
    if not spans:
        return [ROLE_ID["template"]] * len(starts)
    span_start = np.asarray([a for a, _ in spans], dtype=np.int64)
    span_end = np.asarray([b for _, b in spans], dtype=np.int64)
    span_role = np.asarray([ROLE_ID["artifact"] if m.is_artifact else ROLE_ID[m.role] for m in messages])
    i = np.searchsorted(span_start, starts, side="right") - 1
    inside = (i >= 0) & (starts < span_end[np.clip(i, 0, None)])
    return np.where(inside, span_role[np.clip(i, 0, None)], ROLE_ID["template"]).tolist()


class _TrajectoryCache:
    """Per-trajectory memo: message table, HF message dicts, prefix renderings and prompt tokens."""

    def __init__(self, traj: Trajectory | None = None):
        self.table = traj.message_table() if traj is not None else {}
        self._hf: dict[str, dict] = {}
        self.spans: dict[str, tuple[list[str], list[int], dict[int, str]]] = {}
        self.prompts: list[tuple[str, list[int], np.ndarray]] = []

    def hf(self, m: Message) -> dict[str, Any]:
        d = self._hf.get(m.id)
        if d is None:
            d = self._hf[m.id] = message_to_hf(m)
        return d


# What a serving session keeps between its calls for Renderer.encode_continuing / remember (the gateway).
PromptCache = _TrajectoryCache

"""``hf:DIR`` — a local transformers causal LM as a sampler.

Temperature sampling, per-token rollout logprobs (of the distribution sampled from, softmax(logits / T);
greedy: untempered) and their top-k. The KV cache is reused while the context only grows: each call keeps
the cached prefix it shares with the new prompt and recomputes the rest, so after an eviction everything
past the shared system/task prefix is rebuilt.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from memorywalker.records.schema import Task
from memorywalker.render.render import eot_ids
from memorywalker.samplers.base import PolicyOutput, PolicyRequest


class HFPolicy:
    """Sample from a local causal LM with a reusable KV cache; record per-token logprobs and top-k.

    The recorded logprobs are of the distribution each token was sampled from, ``softmax(logits / T)``;
    greedy decoding (``T = 0``) records the untempered ``softmax(logits)``. A trainer comparing against
    them divides its logits by the same ``T`` (``EngineConfig.temperature``).
    """

    name = "hf"

    def __init__(self, model_dir: str, *, temperature: float = 1.0, max_new_tokens: int = 256, top_k: int = 5,
                 dtype: str = "float32", device: str = "cpu", stop_ids: list[int] | None = None,
                 model=None, tokenizer=None):
        import torch  # lazy: this module loads at CLI start
        from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: this module loads at CLI start

        self.model_dir = str(model_dir)
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
        self.model = model.eval()
        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_dir)
        # Stop on the end-of-turn tokens the Renderer recognises (eos + known EOT specials).
        self.stop_ids = set(stop_ids if stop_ids is not None else eot_ids(tok))
        self.temperature, self.max_new_tokens, self.top_k = temperature, max_new_tokens, top_k
        self.dtype, self.device = dtype, device
        # Transformers 5 renamed ``past_key_values`` to ``cache``; accept both.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stats = {"reused_tokens": 0, "computed_tokens": 0, "rebuilds": 0}
        self._cache = None
        self._cached: list[int] = []  # token ids whose keys/values are in the cache

    @classmethod
    def from_model(cls, model, tokenizer, **kwargs: Any) -> HFPolicy:
        """Sample from a model already in memory (e.g. the one a recipe is training): nothing is reloaded,
        so every episode sees the current weights. Puts ``model`` in eval mode."""
        param = next(model.parameters())
        return cls(str(getattr(model, "name_or_path", "") or "in-memory"), model=model, tokenizer=tokenizer,
                   dtype=str(param.dtype).removeprefix("torch."), device=str(param.device), **kwargs)

    def start(self, task: Task | None = None) -> None:
        self._cache, self._cached = None, []

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model_dir, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens, "top_k": self.top_k, "dtype": self.dtype}

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        return self.generate(request.prompt_ids, seed=request.seed, max_new_tokens=request.max_new_tokens)

    def _prefill(self, prompt: list[int]):
        """Logits after ``prompt``, reusing the cached prefix it shares with the previous sequence."""
        import torch  # lazy: this module loads at CLI start
        from transformers import DynamicCache  # lazy: this module loads at CLI start

        shared = 0
        for a, b in zip(self._cached, prompt, strict=False):
            if a != b:
                break
            shared += 1
        shared = min(shared, len(prompt) - 1)  # at least one new token must be fed to get logits
        if self._cache is None or shared == 0:
            self._cache, shared = DynamicCache(config=self.model.config), 0
            self.stats["rebuilds"] += 1
        elif shared < len(self._cached):
            # The context was rewritten (eviction): drop the stale suffix. Transformers 5 takes the
            # number of tokens to remove, as a negative count.
            self._cache.crop(shared - self._cache.get_seq_length())
            self.stats["rebuilds"] += 1
        self.stats["reused_tokens"] += shared
        self.stats["computed_tokens"] += len(prompt) - shared
        ids = torch.tensor([prompt[shared:]], device=self.device)
        out = self._forward(ids)
        self._cached = list(prompt)
        return out.logits[0, -1]

    @property
    def _recorded_temperature(self) -> float:
        """T of the distribution the recorded logprobs are of: the sampling temperature; 1 when greedy."""
        return self.temperature if self.temperature > 0 else 1.0

    def _forward(self, ids):
        # logits_to_keep=1: only the last position's logits are needed to sample the next token.
        return self._forward_cached(ids, self._cache)

    def _forward_cached(self, ids, cache):
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})

    @staticmethod
    def _sample(logits, temperature: float, generator):
        import torch  # lazy: this module loads at CLI start

        if temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))

    def generate(self, prompt: list[int], *, seed: int, max_new_tokens: int | None = None) -> PolicyOutput:
        import torch  # lazy: this module loads at CLI start

        gen = torch.Generator(device=self.device).manual_seed(seed)
        limit = max_new_tokens or self.max_new_tokens
        tokens: list[int] = []
        logprobs: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        finish = "length"
        with torch.no_grad():
            logits = self._prefill(prompt)
            while len(tokens) < limit:
                # Rollout logprobs are of the distribution sampled from: logits / T (greedy: untempered).
                lp = torch.log_softmax(logits.float() / self._recorded_temperature, dim=-1)
                tok = self._sample(logits, self.temperature, gen)
                tokens.append(tok)
                logprobs.append(float(lp[tok]))
                values, idx = torch.topk(lp, self.top_k)
                tops.append([(int(i), float(v)) for i, v in zip(idx.tolist(), values.tolist(), strict=True)])
                if tok in self.stop_ids:
                    finish = "stop"
                    break
                if len(tokens) == limit:
                    break
                out = self._forward(torch.tensor([[tok]], device=self.device))
                self._cached.append(tok)
                logits = out.logits[0, -1]
        return PolicyOutput(token_ids=tokens, logprobs=logprobs, top_logprobs=tops, finish_reason=finish)

    def score(self, prompt: list[int], response: list[int]) -> list[float]:
        """Teacher-forced logprobs of ``response`` after ``prompt``, of the distribution :meth:`generate` records
        (``softmax(logits / T)``; untempered when greedy). Reuses the KV cache like :meth:`generate`, so a
        scripted response is scored at the cost of its own tokens."""
        import torch  # lazy: this module loads at CLI start

        if not response:
            return []
        with torch.no_grad():
            first = self._prefill(prompt)  # [V]: predicts response[0]
            rest = response[:-1]
            logits = [first[None]]
            if rest:
                ids = torch.tensor([rest], device=self.device)
                out = self.model(input_ids=ids, use_cache=True, logits_to_keep=len(rest), **{self._cache_kw: self._cache})
                self._cached += rest
                logits.append(out.logits[0])  # [len(rest), V]
            lp = torch.log_softmax(torch.cat(logits).float() / self._recorded_temperature, dim=-1)
            return lp.gather(1, torch.tensor(response, device=lp.device)[:, None])[:, 0].tolist()

    def generate_batch(self, prompts: list[list[int]], *, seeds: list[int],
                       max_new_tokens: int | None = None) -> list[PolicyOutput]:
        """:meth:`generate` for several prompts in one batched forward per token (left-padded, each row
        with its own attention mask, positions and sampling generator seeded like :meth:`generate`).

        Rows stop independently; a finished row is fed a pad token until the last one stops. The KV
        cache is not kept between calls. A row's logprobs equal a plain forward of its own sequence to
        float rounding (tested to 1e-5 in fp32), so its samples are :meth:`generate`'s except where two
        tokens tie within that rounding.
        """
        import torch  # lazy: this module loads at CLI start
        from transformers import DynamicCache  # lazy: this module loads at CLI start

        limit = max_new_tokens or self.max_new_tokens
        n = len(prompts)
        # The prefix every prompt shares (system prompt, tools) is computed once and its cache repeated
        # per row; each row's rest is left-padded after it: [shared][pad…][rest], pads masked out.
        shared = min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)
        rests = [p[shared:] for p in prompts]
        width = max(len(r) for r in rests)
        ids = torch.zeros(n, width, dtype=torch.long)
        mask = torch.cat([torch.ones(n, shared, dtype=torch.long), torch.zeros(n, width, dtype=torch.long)], dim=1)
        for b, r in enumerate(rests):
            ids[b, width - len(r):] = torch.tensor(r)
            mask[b, shared + width - len(r):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        gens = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        outs = [PolicyOutput(token_ids=[], logprobs=[], top_logprobs=[], finish_reason="length") for _ in prompts]
        live = list(range(n))
        cache = DynamicCache(config=self.model.config)
        with torch.no_grad():
            if shared:
                self._forward_cached(torch.tensor([prompts[0][:shared]], device=self.device), cache)
                cache.batch_repeat_interleave(n)
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                             position_ids=pos.to(self.device), use_cache=True, logits_to_keep=1,
                             **{self._cache_kw: cache})
            for step in range(limit):
                logits = out.logits[:, -1].float()
                lp = torch.log_softmax(logits / self._recorded_temperature, dim=-1)  # all rows; sampling per row
                values, idx = (t.tolist() for t in torch.topk(lp, self.top_k))
                if self.temperature <= 0:
                    toks = dict(enumerate(logits.argmax(-1).tolist()))
                else:
                    probs = torch.softmax(logits / self.temperature, dim=-1)
                    toks = {b: int(torch.multinomial(probs[b], 1, generator=gens[b])) for b in live}
                chosen = lp[live, [toks[b] for b in live]].tolist()
                nxt = torch.zeros(n, 1, dtype=torch.long)
                for b, logprob in zip(live, chosen, strict=True):
                    o, tok = outs[b], toks[b]
                    o.token_ids.append(tok)
                    o.logprobs.append(logprob)
                    o.top_logprobs.append(list(zip(idx[b], values[b], strict=True)))
                    nxt[b, 0] = tok
                    if tok in self.stop_ids:
                        o.finish_reason = "stop"
                live = [b for b in live if outs[b].finish_reason != "stop"]
                if not live or step + 1 == limit:
                    break
                mask = torch.cat([mask, torch.ones(n, 1, dtype=torch.long)], dim=1)
                pos = pos[:, -1:] + 1
                out = self.model(input_ids=nxt.to(self.device), attention_mask=mask.to(self.device),
                                 position_ids=pos.to(self.device), use_cache=True, logits_to_keep=1,
                                 **{self._cache_kw: cache})
        return outs

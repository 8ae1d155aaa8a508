"""``memorywalker rollout``: episodes of an environment suite under a compression policy (``--compressor``).

    memorywalker rollout --env websearch --suite chain --compressor claude-code --sampler expert --n 100 --seed 0 -o chain.jsonl
    memorywalker rollout --env corpus --corpus docs.jsonl --queries queries.jsonl --compressor opencode --n 8 -o corpus.jsonl
    memorywalker rollout --env vault --suite recall-2 --sampler vllm:MODEL_DIR --n 16 --samples 4 -o vault.jsonl

Output is append-only trajectory JSONL: re-running the same command after an interruption resumes where
it stopped, without duplicating or losing episodes. Resuming checks that the file's episodes were run
with the same environment, compressor and sampler settings (``--override-config`` appends anyway).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from memorywalker.cli import renamed
from memorywalker.cli.harness_options import HELP, harness_option
from memorywalker.cli.tokenizers import load_tokenizer
from memorywalker.render.chat_templates import use_chat_template

# the compressor and environment registries, and the rollout machinery (loaded at CLI start anyway)
from memorywalker.rollout import COMPRESSORS, ENVIRONMENTS, HarnessConfig, make_policy, rollout
from memorywalker.rollout.episodes.backends import SPECS
from memorywalker.rollout.episodes.faults import FaultConfig, FaultInjector

_SUITES = "; ".join(f"{name}: {' | '.join(env.suites)}" for name, env in ENVIRONMENTS.items())

def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout_cmd)


def rollout_cmd(
    env: str = typer.Option("websearch", "--env", help="environment: " + " | ".join(ENVIRONMENTS)),
    suite: str = typer.Option(None, "--suite", help=_SUITES + " (default: the suite of an env with one)"),
    corpus: Path = typer.Option(None, "--corpus", help="corpus env: documents JSONL or Parquet (default: the shipped tiny corpus)"),
    queries: Path = typer.Option(None, "--queries", help="corpus env: queries JSONL or Parquet (with --corpus)"),
    index_cache: Path = typer.Option(None, "--index-cache", help="corpus env: save the BM25 index here once, reuse it after"),
    compressor: str = renamed.option("--compressor", "none", "compression policy: " + " | ".join(COMPRESSORS)),
    harness: str = renamed.old_option("--compressor"),
    sampler: str = renamed.option("--sampler", "expert", "who writes the responses: " + SPECS),
    policy: str = renamed.old_option("--sampler"),
    n: int = typer.Option(..., "--n", min=1, help="number of tasks"),
    seed: int = typer.Option(0, "--seed", help="run seed (episode seeds derive from it)"),
    output: Path = typer.Option(..., "-o", "--output", help="trajectory JSONL (appended to; resumable)"),
    split: str = typer.Option(None, "--split", help="only tasks of this split: train | valid | test"),
    samples: int = typer.Option(1, "--samples", min=1, help="rollouts per task (a GRPO group)"),
    budget: int = harness_option("budget"),
    watermark: float = harness_option("watermark"),
    keep_recent: int = harness_option("keep_recent"),
    max_steps: int = harness_option("max_steps"),
    max_context: int = typer.Option(None, "--max-context", min=1,
                                    help=f"{HELP['max_context']} (default: {HarnessConfig.max_context}; vllm: at most "
                                         "the model's positions − --max-new-tokens)"),
    world_seed: int = typer.Option(0, "--world-seed", help="seed of the generated world"),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="HF tokenizer dir (default: the model's, or the kit's for expert)"),
    chat_template: str = typer.Option(None, "--chat-template", help="Render with this template instead of the "
                                      "tokenizer's: a Jinja file or a shipped name (memorywalker gateway --help)."),
    tool_parser: str = typer.Option(None, "--tool-parser", help="The sampled tool-call format (default: the "
                                    "template's: hermes, qwen3_coder, llama3_json, mistral, glm45, deepseek_v3)."),
    temperature: float = typer.Option(1.0, "--temperature", help="hf/openai sampling temperature"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="hf/openai response length limit"),
    top_k: int = typer.Option(5, "--top-k", help="top-k logprobs recorded per token"),
    dtype: str = typer.Option("float32", "--dtype", help="hf/vllm: the sampler's parameter dtype: float32 | bfloat16"),
    batch: int = typer.Option(0, "--batch", min=0,
                              help="episodes run in lockstep, their calls batched (0 = vllm: 64, others: 1)"),
    max_model_len: int = typer.Option(None, "--max-model-len", min=2,
                                      help="vllm: the engine's window (default: --max-context + --max-new-tokens)"),
    kv_cache_gib: float = typer.Option(1.0, "--kv-cache-gib", min=0.01, help="vllm: KV cache size in GiB"),
    model: str = typer.Option("default", "--model", help="openai: model name sent to the server"),
    request_timeout: float = typer.Option(120.0, "--request-timeout", min=0.001,
                                          help="openai: seconds one request may take in all (connecting, headers, the whole "
                                               "body) before it is retried"),
    retries: int = typer.Option(3, "--retries", min=0,
                                help="openai: retries of a refused connection, timeout or 5xx (backoff 1, 2, 4 s...)"),
    override_config: bool = typer.Option(False, "--override-config",
                                         help="append to an output whose episodes used another configuration"),
    fault_rate: float = typer.Option(0.0, "--fault-rate", min=0.0, max=1.0,
                                     help="inject tool faults into this share of search/open calls (0 = off)"),
    fault_kinds: str = typer.Option("error,timeout,stale", "--fault-kinds", help="comma-separated fault kinds"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Roll out N tasks of a suite with a sampler under a compression policy; record every call."""
    if env not in ENVIRONMENTS:
        raise typer.BadParameter(f"unknown env {env!r}; valid: {', '.join(ENVIRONMENTS)}")
    if suite is None and len(ENVIRONMENTS[env].suites) != 1:
        raise typer.BadParameter(f"--suite is required for env {env}; valid: {', '.join(ENVIRONMENTS[env].suites)}")
    suite = suite or ENVIRONMENTS[env].suites[0]
    if suite not in ENVIRONMENTS[env].suites:
        raise typer.BadParameter(f"unknown suite {suite!r} of env {env}; valid: {', '.join(ENVIRONMENTS[env].suites)}")
    compressor = renamed.value("--compressor", compressor, harness, "none", "memorywalker rollout")
    if compressor not in COMPRESSORS:
        raise typer.BadParameter(f"unknown compressor {compressor!r}; valid: {', '.join(COMPRESSORS)}")
    if split not in (None, "train", "valid", "test"):
        raise typer.BadParameter(f"unknown split {split!r}; valid: train, valid, test")
    env_files = {"corpus": corpus, "queries": queries, "index_cache": index_cache} if env == "corpus" else {}
    if env != "corpus" and (corpus or queries or index_cache):
        raise typer.BadParameter(f"--corpus, --queries and --index-cache apply to --env corpus, not {env}")
    # Built once: the expert is the environment's. A bad corpus file fails here with FILE: line N: cause.
    environment = ENVIRONMENTS[env](world_seed=world_seed, **env_files)
    policy = renamed.value("--sampler", sampler, policy, "expert", "memorywalker rollout")
    kind, _, arg = policy.partition(":")
    kwargs = {}
    if kind in ("hf", "openai", "vllm"):
        kwargs = dict(temperature=temperature, max_new_tokens=max_new_tokens, top_k=top_k)
        if kind in ("hf", "vllm"):
            if dtype not in ("float32", "bfloat16"):
                raise typer.BadParameter(f"unknown dtype {dtype!r}; valid: float32, bfloat16", param_hint="--dtype")
            kwargs["dtype"] = dtype
        if kind == "openai":
            kwargs.update(model=model, timeout=request_timeout, retries=retries)
        if kind == "vllm":
            max_context = _fit_vllm(arg, max_context, max_new_tokens, max_model_len)
            window = max_model_len or max_context + max_new_tokens
            if max_context + max_new_tokens > window:  # the episodes would send prompts the engine refuses
                raise typer.BadParameter(f"--max-context {max_context} + --max-new-tokens {max_new_tokens} exceeds "
                                         f"--max-model-len {window}: a call could not fit the engine's window",
                                         param_hint="--max-model-len")
            kwargs.update(max_model_len=window, kv_cache_gib=kv_cache_gib)
    batch = batch or (64 if kind == "vllm" else 1)
    try:
        pol = make_policy(policy, env=environment, **kwargs)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if tokenizer is None:
        if kind in ("hf", "vllm"):
            tokenizer = Path(arg)
        elif kind == "openai":
            raise typer.BadParameter("--sampler openai:URL needs --tokenizer DIR (the served model's tokenizer)")
    tok = load_tokenizer(tokenizer)  # None: the kit's (the expert and scripted samplers)
    use_chat_template(tok, chat_template)
    config = HarnessConfig(compressor, budget=budget, watermark=watermark, keep_recent=keep_recent,
                           max_steps=max_steps, max_context=max_context or HarnessConfig.max_context,
                           tool_parser=tool_parser)
    if fault_rate > 0:  # opt-in: without it episodes are byte-identical to a plain run
        try:
            faults = FaultConfig(rate=fault_rate, kinds=tuple(k.strip() for k in fault_kinds.split(",") if k.strip()),
                                 seed=seed)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        environment = FaultInjector(environment, faults)
    try:
        _, summary = rollout(environment, pol, tok, config, suite=suite, n=n, seed=seed, split=split,
                             samples=samples, out=output, progress=progress, override_config=override_config,
                             batch=batch)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    finally:
        if hasattr(pol, "close"):
            pol.close()  # a vllm engine's processes

    table = Table(title=f"memorywalker rollout {env}/{suite} · {compressor} · {policy}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("episodes written now", str(summary.written))
    table.add_row("already in file (resumed)", str(summary.skipped))
    table.add_row("success (written now)", f"{summary.success:.3f}")
    for k, cnt in sorted(summary.evictions.items()):
        table.add_row(f"episodes with {k} evictions", str(cnt))
    for kind_, cnt in sorted(summary.kinds.items()):
        table.add_row(f"evictions: {kind_}", str(cnt))
    Console().print(table)
    typer.echo(f"{output}: {summary.skipped + summary.written} episodes")


def _fit_vllm(model_dir: str, max_context: int | None, max_new_tokens: int, max_model_len: int | None) -> int:
    """``--max-context`` for a vLLM engine on ``model_dir``: by default HarnessConfig's, lowered so that
    context + response fit the model's positions (vLLM refuses a window past them: 8192 + 256 on an
    8192-position model); a window given past them is refused here, naming the flag to change."""
    from memorywalker.train.inputs import model_positions  # lazy: the command's machinery, only when it runs

    positions = model_positions(model_dir)  # None: unreadable config, vLLM decides
    if max_model_len and positions and max_model_len > positions:
        raise typer.BadParameter(f"--max-model-len {max_model_len} exceeds the {positions} positions of {model_dir}",
                                 param_hint="--max-model-len")
    if positions and max_new_tokens >= positions:
        raise typer.BadParameter(f"--max-new-tokens {max_new_tokens} leaves no context in the {positions} positions "
                                 f"of {model_dir}", param_hint="--max-new-tokens")
    if max_context is None:
        default = HarnessConfig.max_context
        return default if positions is None or max_model_len else min(default, positions - max_new_tokens)
    if positions and not max_model_len and max_context + max_new_tokens > positions:
        raise typer.BadParameter(f"--max-context {max_context} + --max-new-tokens {max_new_tokens} = "
                                 f"{max_context + max_new_tokens} exceeds the {positions} positions of {model_dir}: "
                                 f"lower --max-context to {positions - max_new_tokens} or less",
                                 param_hint="--max-context")
    return max_context

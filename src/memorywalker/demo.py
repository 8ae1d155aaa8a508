"""The embedded default: reproduce the core result on a model trained here, offline, on CPU.

    memorywalker demo [--quick] [--out DIR]

1. **Kit.** A byte-level BPE tokenizer trained on the offline web-search world's pages and a tiny random
   Llama, saved as ordinary Hugging Face directories.
2. **Expert data.** Scripted expert episodes on the train split under a compressing harness (most see
   1–4 evictions).
3. **SFT warm start** on them with the exact ``radix`` method.
4. **RL, once per method.** From that same checkpoint, with the same seed and the same budget, GRPO on
   episodes the model itself collects under compression, trained with every registered method but the
   per-call reference (``memorywalker.engine.METHODS``).
5. **Evaluation** of each resulting model on held-out (test split) tasks under the same harness:
   reward; the gap between the trainer's logprobs under the method's conditioning and the rollout
   logprobs the sampler recorded (overall; on heavy targets, 2+ branches of the history before their
   call; on the floor, calls before any branch; by branches and by recorded evictions); k3 KL; logit drift
   against the deployment distribution; ``eps_kl`` = mean KL(full view ‖ compressed) at junctions,
   which SDCC trains down; RL tokens processed and wall time.

Writes ``DIR/results.json``, PNG plots and ``DIR/index.html`` and prints the table. Everything is
seeded; nothing is downloaded.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from memorywalker.engine.methods import method_names
from memorywalker.metrics.gap import fmt_metric as _fmt

METHODS = tuple(method_names(reference=False))


@dataclass(frozen=True)
class DemoConfig:
    seed: int = 0
    # --- world and harness: small enough for a tiny model trained for minutes on a CPU
    suite: str = "lookup"
    # 8 entities instead of the default world's 66: a tiny model trained for minutes on a CPU still does
    # not solve held-out tasks (see the README), but the smaller world is the easiest one to try.
    world_size: dict[str, int] = field(default_factory=lambda: {"n_cities": 2, "n_companies": 3, "n_people": 3,
                                                                 "n_distractors": 2})
    harness: str = "claude-code"  # the model summarizes the history; system prompt and task are kept
    budget: int = 500  # context budget (prompt tokens): 2 compactions per expert lookup episode
    max_turns: int = 5
    max_new_tokens: int = 48
    # --- model
    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 4
    # --- SFT warm start (radix)
    sft_episodes: int = 64
    sft_steps: int = 160
    sft_batch: int = 4
    sft_lr: float = 3e-3
    # --- RL per method
    rl_steps: int = 4
    rl_prompts: int = 2
    rl_group: int = 4
    rl_lr: float = 3e-4
    sdcc_lambda: float = 1.0
    # --- evaluation
    eval_episodes: int = 16
    eval_temperature: float = 0.0  # greedy; rollout logprobs are of the untempered distribution either way
    methods: tuple[str, ...] = METHODS


FULL = DemoConfig()
QUICK = replace(FULL, sft_episodes=32, sft_steps=60, rl_steps=2, rl_prompts=2, rl_group=2, eval_episodes=6)


def run_demo(cfg: DemoConfig, out: str | Path, *, progress: bool = True, log=print) -> dict:
    """Run every stage; return the results dict (also written to ``out/results.json``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memorywalker.engine import Batch, EngineConfig, run
    from memorywalker.metrics.gap import gap_report
    from memorywalker.modelkit import build_model, build_tokenizer, bundled_corpus
    from memorywalker.recipes import rl, sft
    from memorywalker.records import write_trajectories
    from memorywalker.render import Renderer, RenderOptions
    from memorywalker.rollout import ExpertPolicy, HarnessConfig, HFPolicy, WebSearchEnv, rollout

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    env = WebSearchEnv(cfg.seed, world_size=cfg.world_size)
    harness = HarnessConfig(cfg.harness, budget=cfg.budget, max_steps=cfg.max_turns)

    # --- 1. kit: tokenizer on the world's text, tiny random Llama ---------------------------------------
    corpus = bundled_corpus() + [p.text for p in env.world.pages.values()]
    bootstrap = AutoTokenizer.from_pretrained(build_tokenizer(out / "kit" / "bootstrap", corpus, vocab_size=512))
    seen, _ = rollout(env, ExpertPolicy(), bootstrap, harness, suite=cfg.suite, n=8, seed=cfg.seed, split="train")
    corpus += [_transcript(bootstrap, t) for t in seen]  # tool-call scaffolding merges into tokens too
    tok_dir = build_tokenizer(out / "kit" / "tokenizer", corpus, vocab_size=cfg.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    model_dir = build_model(out / "kit" / "model", tok_dir, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                            num_heads=4, num_kv_heads=2, seed=cfg.seed)
    log(f"[kit] vocab {len(tokenizer)}, model {model_dir}")

    # --- 2. expert episodes under compression ------------------------------------------------------------
    expert, summary = rollout(env, ExpertPolicy(), tokenizer, harness, suite=cfg.suite, n=cfg.sft_episodes,
                              seed=cfg.seed, split="train")
    write_trajectories(out / "expert.jsonl", expert)
    evictions = {k: summary.evictions[k] for k in sorted(summary.evictions)}
    log(f"[data] {len(expert)} expert episodes, success {summary.success:.2f}, evictions per episode {evictions}")

    # --- 3. SFT warm start (exact radix) ----------------------------------------------------------------
    t0 = time.perf_counter()
    warm = sft.train(sft.SFTConfig(model=str(model_dir), run_dir=str(out / "sft"), method="radix",
                                   steps=cfg.sft_steps, batch_size=cfg.sft_batch, lr=cfg.sft_lr, warmup_steps=10,
                                   max_tokens=2048, save_every=cfg.sft_steps, seed=cfg.seed),
                     trajectories=expert, progress=progress)
    sft_loss = [float(m["loss"]) for m in warm.metrics]
    log(f"[sft] loss {sft_loss[0]:.3f} -> {sft_loss[-1]:.3f} in {time.perf_counter() - t0:.0f}s")

    # --- 4. RL from the same checkpoint, once per method ---------------------------------------------------
    trained, curves = {}, {}
    for method in cfg.methods:
        t0 = time.perf_counter()
        res = rl.train(rl.RLConfig(model=str(warm.final_dir), run_dir=str(out / f"rl-{method}"), method=method,
                                   steps=cfg.rl_steps, prompts_per_step=cfg.rl_prompts, group_size=cfg.rl_group,
                                   suite=cfg.suite, harness=cfg.harness, budget=cfg.budget, max_turns=cfg.max_turns,
                                   max_new_tokens=cfg.max_new_tokens, lr=cfg.rl_lr, sdcc_lambda=cfg.sdcc_lambda,
                                   max_tokens=4096, save_every=cfg.rl_steps, seed=cfg.seed),
                       env=env, progress=progress)
        seconds = time.perf_counter() - t0
        trained[method] = (res.final_dir, seconds, int(sum(_num(m.get("tokens")) for m in res.metrics)))
        curves[method] = [_num(m.get("logprob_abs_diff")) for m in res.metrics]
        log(f"[rl:{method}] {seconds:.0f}s, reward per step "
            f"{[round(_num(m.get('reward_mean')), 2) for m in res.metrics]}")

    # --- 5. held-out evaluation under the same harness ---------------------------------------------------
    results: dict[str, dict] = {}
    renderer = Renderer(tokenizer, RenderOptions(truncated="prefix"))
    for method, (final_dir, seconds, tokens) in trained.items():
        model = AutoModelForCausalLM.from_pretrained(final_dir).eval()
        policy = HFPolicy.from_model(model, tokenizer, temperature=cfg.eval_temperature,
                                     max_new_tokens=cfg.max_new_tokens)
        episodes, ev = rollout(env, policy, tokenizer, harness, suite=cfg.suite, n=cfg.eval_episodes,
                               seed=cfg.seed + 1, split="test")
        write_trajectories(out / f"eval-{method}.jsonl", episodes)  # `memorywalker gap` can re-measure them
        gap = gap_report(model, renderer, episodes, [method])[method]
        batch = Batch.from_groups([[renderer.render(t, full_view=True)] for t in episodes])
        kl = run(model, batch, EngineConfig(method="sdcc"), backward=False).metrics
        results[method] = {
            "reward": ev.success,
            "logprob_abs_diff": gap["overall"]["logprob_abs_diff"],
            "logprob_abs_diff_heavy": gap["heavy"]["logprob_abs_diff"],
            "logprob_abs_diff_floor": gap["floor"]["logprob_abs_diff"],
            "logprob_abs_diff_by_branches": {k: v["logprob_abs_diff"] for k, v in gap["by_branches"].items()},
            "targets_by_branches": {k: v["targets"] for k, v in gap["by_branches"].items()},
            "logprob_abs_diff_by_evictions": {k: v["logprob_abs_diff"] for k, v in gap["by_evictions"].items()},
            "targets_by_evictions": {k: v["targets"] for k, v in gap["by_evictions"].items()},
            "targets": gap["overall"]["targets"],  # compared targets: rightmost loses the evicted ones
            "k3_kl": gap["overall"]["k3_kl"],
            "logit_drift": gap["overall"]["logit_drift"],
            "eps_kl": _num(kl.get("eps_kl_mean")),
            "tokens": tokens,
            "seconds": round(seconds, 1),
            "gap_over_steps": curves[method],
            "eval_evictions": {str(k): ev.evictions[k] for k in sorted(ev.evictions)},
        }
        log(f"[eval:{method}] reward {ev.success:.2f}, logprob_abs_diff {_fmt(results[method]['logprob_abs_diff'])}")

    doc = {"config": asdict(cfg), "sft_loss": sft_loss, "expert_evictions": evictions,
           "methods": results, "seconds_total": round(time.perf_counter() - t_start, 1)}
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=_num))
    write_report(doc, out)
    return doc


# --- report ------------------------------------------------------------------------------------------------


def _num(v) -> float:
    if v is None:
        return float("nan")
    return float(v.item()) if hasattr(v, "item") else float(v)


COLUMNS = ("reward", "logprob_abs_diff", "logprob_abs_diff_heavy", "logprob_abs_diff_floor", "k3_kl",
           "logit_drift", "eps_kl", "targets", "tokens", "seconds")


def results_table(doc: dict) -> str:
    """The results as a fixed-width text table (also what the README quotes)."""
    head = ["method", *COLUMNS]
    rows = [[m, *(str(r[c]) if c in ("targets", "tokens", "seconds") else _fmt(r[c]) for c in COLUMNS)]
            for m, r in doc["methods"].items()]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))  # noqa: E731
    return "\n".join([line(head), *(line(r) for r in rows)])


def write_report(doc: dict, out: Path) -> None:
    """PNG plots (gap by evictions, reward, gap over RL steps) and an index.html showing them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(doc["methods"])
    res = doc["methods"]
    buckets = ["0", "1", "2", "3+"]

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        vals = [res[m]["logprob_abs_diff_by_evictions"].get(b) for b in buckets]
        vals = [np.nan if v is None else max(v, 1e-9) for v in vals]
        ax.bar(np.arange(len(buckets)) + i * width, vals, width, label=m)
    ax.set_xticks(np.arange(len(buckets)) + width * (len(methods) - 1) / 2, [f"{b} evictions" for b in buckets])
    ax.set_yscale("log")
    ax.set_ylabel("mean |logp_train − logp_rollout|")
    ax.set_title("train/rollout gap by evictions before the call")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gap_by_evictions.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(methods, [res[m]["reward"] for m in methods], color="tab:green")
    ax.set_ylabel("held-out reward (exact match)")
    ax.set_ylim(0, 1)
    ax.set_title("reward per method")
    fig.tight_layout()
    fig.savefig(out / "reward.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for m in methods:
        ys = [max(v, 1e-9) for v in res[m]["gap_over_steps"]]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=m)
    ax.set_yscale("log")
    ax.set_xlabel("RL step")
    ax.set_ylabel("logprob_abs_diff on the step's rollouts")
    ax.set_title("gap over training steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gap_over_steps.png", dpi=110)
    plt.close(fig)

    table = results_table(doc)
    (out / "index.html").write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>memorywalker demo</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}} pre{{background:#f4f4f4;padding:1em}}</style>
</head><body>
<h1>memorywalker demo</h1>
<p>One tiny model, SFT-warmed on expert episodes, then RL-trained once per method from the same
checkpoint on episodes it collected under the <code>{doc['config']['harness']}</code> harness; evaluated on
held-out tasks under the same harness. Total {doc['seconds_total']} s.</p>
<pre>{table}</pre>
<h2>Gap by evictions</h2><img src="gap_by_evictions.png" alt="gap by evictions">
<h2>Reward</h2><img src="reward.png" alt="reward per method">
<h2>Gap over training steps</h2><img src="gap_over_steps.png" alt="gap over steps">
<p>Raw numbers: <a href="results.json">results.json</a>.</p>
</body></html>
""")


def _transcript(tokenizer, traj) -> str:
    from memorywalker.render import message_to_hf

    return tokenizer.apply_chat_template([message_to_hf(m) for m in traj.messages], tokenize=False)

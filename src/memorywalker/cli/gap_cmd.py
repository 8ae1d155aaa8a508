"""``memorywalker gap``: the train/rollout gap of each method on recorded rollouts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from memorywalker.records import TrajectoryReader
from memorywalker.render import Renderer
from memorywalker.render.chat_templates import use_chat_template
from memorywalker.render.render import RenderOptions
from memorywalker.render.types import left_out_line

console = Console(width=None if sys.stdout.isatty() else 160)

def print_gap_table(report: dict, title: str = "train/rollout gap") -> None:
    """One row per method: logprob_abs_diff overall, on the floor (0 branches), heavy (2+ branches) and
    per bucket of branches before the call (B=0..3+), the other metrics overall. The title says the
    view; recorded evictions per bucket are in ``--json`` (``by_evictions``)."""
    from memorywalker.metrics.gap import BUCKETS  # lazy: metrics.gap pulls torch; off the CLI's start path
    from memorywalker.metrics.gap import fmt_metric as _fmt  # lazy: as above

    table = Table(title=f"{title}, logprob_abs_diff by branches B before the call (segment index)")
    for c in ["method", "targets", "logprob_abs_diff", "floor", "heavy (2+)",
              *[f"B={b}" for b in BUCKETS], "k3_kl", "chi2_token", "log_ppl_abs_diff", "logit_drift"]:
        table.add_column(c, justify="left" if c == "method" else "right")
    for m, r in report.items():
        o = r["overall"]
        table.add_row(m, str(o["targets"]), _fmt(o["logprob_abs_diff"]), _fmt(r["floor"]["logprob_abs_diff"]),
                      _fmt(r["heavy"]["logprob_abs_diff"]),
                      *[_fmt(r["by_branches"][b]["logprob_abs_diff"]) for b in BUCKETS],
                      _fmt(o["k3_kl"]), _fmt(o["chi2_token"]), _fmt(o["log_ppl_abs_diff"]), _fmt(o.get("logit_drift")))
    console.print(table)


def gap(
    model: str = typer.Option(..., help="Hugging Face causal LM directory, or a converted packaged model's "
                                        "name (smollm2-135m: memorywalker models get)."),
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="Trajectory JSONL with rollout logprobs."),
    method: list[str] = typer.Option(None, help="Methods to compare (repeat the option; default: every "
                                                "registered method but the per-call reference)."),
    tokenizer: Path | None = typer.Option(None, help="Tokenizer dir (default: the model's)."),
    chat_template: str | None = typer.Option(None, help="Render with this template instead of the tokenizer's (a "
                                             "Jinja file or a shipped name): the one the records were served "
                                             "with (their meta.chat_template)."),
    drift: bool = typer.Option(True, help="Also compute logit drift (full next-token distributions)."),
    against: str = typer.Option("recorded", help="recorded: the rollout logprobs in the records | per-call: "
                                "this model's own logprobs under the context each call received (exact; for "
                                "logs of another model, e.g. imported harness sessions)."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    truncated: str = typer.Option("exclude", help="A response cut at the length limit: exclude (left out, said so) "
                                  "| prefix (its tokens compared, without a terminator it never produced)."),
    rejects: Path | None = typer.Option(None, help="Write rejected lines with their reasons here (JSONL)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    per_token: bool = typer.Option(False, "--per-token", help="With --json: add every target's logprob per "
                                   "method under \"tokens\" (what `memorywalker view --gap` draws)."),
):
    """Per method: logprob_abs_diff, k3_kl, chi2_token, log_ppl_abs_diff and logit drift against the
    recorded rollout logprobs, overall, by branches before the call (its segment index: 0, 1, 2, 3+,
    whatever rewrote the history), heavy (2+ branches) and on the floor (calls before any branch).
    --json also buckets by recorded evictions (by_evictions)."""
    import torch  # lazy: the command's machinery (torch), only when it runs

    from memorywalker.engine import METHODS, method_names  # lazy: as above
    from memorywalker.metrics.gap import AGAINST, gap_report  # lazy: as above

    method = method or method_names(reference=False)
    unknown = [m for m in method if m not in METHODS]
    if unknown:
        raise typer.BadParameter(f"unknown method(s) {unknown}; valid: {list(METHODS)}")
    if against not in AGAINST:
        raise typer.BadParameter(f"--against {against!r}; valid: {list(AGAINST)}")
    if truncated not in ("exclude", "prefix"):
        raise typer.BadParameter(f"--truncated {truncated!r}; valid: exclude, prefix")
    from memorywalker.train.inputs import FitsModel, model_positions  # lazy: as above
    from memorywalker.train.model import load_model  # lazy: as above

    lm, tok = load_model(model, str(tokenizer) if tokenizer else None, dtype=dtype, device=torch.device("cpu"))
    # Ids the tokenizer does not have, and calls longer than the model's positions: rejected before any forward.
    use_chat_template(tok, chat_template)
    renderer = Renderer(tok, RenderOptions(truncated=truncated))
    reader = TrajectoryReader(data, rejects_path=rejects, vocab_size=len(tok),
                              check=FitsModel(renderer, model_positions(model), keep=False))
    read = list(reader)
    trajs = [t for t in read if against == "per-call" or any(c.rollout_logprobs is not None for c in t.calls)]
    if per_token and not as_json:
        raise typer.BadParameter("--per-token needs --json")
    tokens: dict | None = {} if per_token else None
    left_out: dict = {}
    report = gap_report(lm, renderer, trajs, method, drift=drift, progress=not as_json and sys.stderr.isatty(),
                        tokens=tokens, against=against, left_out=left_out)
    skipped = sum(len(t.calls) for t in read) - sum(len(t.calls) for t in trajs)
    if skipped:  # trajectories with no rollout logprobs at all
        left_out["no rollout logprobs"] = left_out.get("no rollout logprobs", 0) + skipped
    left_out = dict(sorted(left_out.items()))
    total = sum(len(t.calls) for t in read)
    out = {"model": str(model), "data": str(data), "against": against, "truncated": truncated,
           "read": reader.summary.as_dict(), "trajectories_with_logprobs": len(trajs),
           "calls": {"total": total, "left_out": left_out}, "methods": report}
    if tokens is not None:
        out["tokens"] = tokens
    if as_json:
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    print_gap_table(report, "train/rollout gap" if against == "recorded" else
                    "gap against this model's per-call (exact) logprobs")
    console.print(f"{reader.summary}; {len(trajs)} " + ("with rollout logprobs" if against == "recorded" else
                                                        "compared with per-call"))
    console.print(left_out_line(left_out, total, truncated))


def register(app: typer.Typer) -> None:
    app.command()(gap)

"""The gateway's own work per call, in one process without HTTP, and where it goes.

    python scripts/profile_gateway.py --out runs/profile-gateway

:func:`scripts.bench_gateway.session`'s Claude Code-shaped sessions (a 60,000-character system prompt, 12
tools, a tool result per call: 23K–27K-token prompts of the kit tokenizer) parsed as Anthropic requests and
served by :meth:`Gateway.serve` with the ``scripted`` backend, one call at a time; per call the time from
the request body to the reply's SSE events, minus the backend's share (``sample_s``). After a warm-up
session, ``--sessions`` sessions of 8 calls; each session's first call (its whole prompt tokenized) is left
out. Per part, the median of the wrapped functions: rendering the request (the chat template, tokenizing
the new suffix, decoding the whole prompt to check it), the reply (parsing and the tool calls' re-render
check) and the journal line. Default threads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    import bench_gateway as bg

    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway import anthropic, journal
    from memorywalker.modelkit.build import build_model, build_tokenizer, bundled_corpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/profile-gateway"))
    ap.add_argument("--sessions", type=int, default=4)
    args = ap.parse_args()
    kit = args.out / "kit"
    if not (kit / "model" / "config.json").exists():
        build_model(kit / "model", build_tokenizer(kit / "tok"), max_positions=65536)
    (args.out / "script.yaml").write_text(bg.SCRIPT)
    corpus = "\n\n".join(bundled_corpus()) + "\n\n"
    system = (corpus * (60000 // len(corpus) + 1))[:60000]
    shutil.rmtree(args.out / "journal", ignore_errors=True)  # a former run's sessions would be continued
    gw = build_gateway(str(kit / "model"), f"scripted:{args.out / 'script.yaml'}", args.out / "journal",
                       tokenizer=str(kit / "tok"), max_new_tokens=512)
    parts: dict[str, list[float]] = {}
    prompts: list[int] = []

    def timed(name, fn):
        def wrapped(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts.setdefault(name, []).append(time.perf_counter() - t0)
        return wrapped

    gw.render = timed("render (template, tokenize, decode check)", gw.render)
    gw._reply = timed("reply (parse, tool-call re-render check)", gw._reply)
    gw.renderer.prompt_text = timed("  of which the chat template", gw.renderer.prompt_text)
    gw.renderer.encode_continuing = timed("  of which tokenizing", gw.renderer.encode_continuing)
    journal.Journal.append = timed("journal line (JSON, fsync)", journal.Journal.append)

    def run(k: int) -> list[float]:
        messages = [{"role": "user", "content": f"Session {k}: read the parts."}]
        own = []
        for _ in range(8):
            body = json.loads(json.dumps({"model": "kit", "max_tokens": 512, "system": system, "messages": messages,
                                          "tools": bg.tools(), "stream": True}))
            t0 = time.perf_counter()
            request = anthropic.parse(body)
            reply, record = gw.serve(request, ("x-claude-code-session-id", f"profile-{k}"), body, None)
            "".join(anthropic.reply_events(reply, request))
            own.append(time.perf_counter() - t0 - record["sample_s"])
            prompts.append(len(record["context_tokens"]))
            response = record["response"]
            uses = [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]}
                    for c in response.get("tool_calls", [])]
            text = [{"type": "text", "text": response["content"]}] if response.get("content") else []
            messages.append({"role": "assistant", "content": text + uses or [{"type": "text", "text": "."}]})
            if uses:
                messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"],
                                                              "content": f"part {k} " * 250}]})
        return own[1:]  # the first call tokenizes its whole prompt

    run(-1)  # warm-up
    parts.clear()
    prompts.clear()
    own = sorted(t for k in range(args.sessions) for t in run(k))
    lines = [f"gateway's own work per call (no HTTP; {len(own)} calls): p50 {1000 * statistics.median(own):.1f} ms, "
             f"p95 {1000 * own[int(0.95 * (len(own) - 1))]:.1f} ms; prompts of {min(prompts)}–{max(prompts)} tokens"]
    lines += [f"  {name}: median {1000 * statistics.median(v):.2f} ms" for name, v in parts.items()]
    (args.out / "profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

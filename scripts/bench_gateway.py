"""The gateway's added latency per call: the client's round trip minus the backend's own share.

    python scripts/bench_gateway.py --out runs/bench-gateway
    python scripts/bench_gateway.py --out runs/bench-gateway-smollm2 --model smollm2-135m --backend hf \
        --system-chars 8000 --calls 5 --max-new-tokens 64   # a real tokenizer, template and sampler (memorywalker models get)

Sessions shaped like Claude Code's (a 60,000-character system prompt, 12 tools — about 28K tokens of the
kit tokenizer, as Claude Code's first request — each call adding a tool call and a ~2,000-character result) speak Anthropic Messages (streaming) to a gateway serving the
kit Llama (65,536 positions) with the ``scripted`` backend. Per call, the backend's share is the
``sample_s`` the gateway journals (the backend call, a serial backend's queue included); what remains
of the round trip is the gateway: HTTP, parsing, rendering with the chat template, tokenizing,
fsyncing the journal, the SSE stream. p50/p95 at 1 and 8 concurrent sessions, default threads.
With ``--model DIR --backend hf`` the gateway serves that model (its own tokenizer and template) and
samples; a reply without a tool call is followed by "Go on." so every session makes ``--calls`` calls.
With ``--backend openai:URL[,URL...]`` the samples come from ``vllm serve`` of ``--model`` (a fleet for
several URLs: every call in flight, no lock), as ``rl rollout_engine=vllm-server`` has them::

    python scripts/bench_gateway.py --out runs/bench-gateway-vllm --model KIT64 --tokenizer KIT_TOK \
        --backend openai:http://127.0.0.1:8000 --upstream-model kit --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import threading
import time
from pathlib import Path

SCRIPT = """
steps:
""" + "".join(f"""  - tool_calls: [{{name: Bash, arguments: {{command: "cat part-{k}.txt"}}}}]
""" for k in range(8)) + """  - text: "Done."
"""


def tools() -> list[dict]:
    return [{"name": f"Tool{k}" if k else "Bash", "description": f"Tool number {k}. " * 20,
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
            for k in range(12)]


def session(url: str, k: int, calls: int, system: str, out: list) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="x", timeout=600, max_retries=0)
    messages = [{"role": "user", "content": f"Session {k}: read the parts."}]
    for seq in range(calls):
        t0 = time.perf_counter()
        with client.messages.stream(model="kit", max_tokens=512, system=system, messages=messages, tools=tools(),
                                    extra_headers={"x-claude-code-session-id": f"bench-{k}"}) as s:
            reply = s.get_final_message()
        out.append((f"bench-{k}", seq, time.perf_counter() - t0))
        uses = [b for b in reply.content if b.type == "tool_use"]
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]
                         or [{"type": "text", "text": "."}]})
        if uses:
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                          "content": f"part {k} " * 250}]})
        else:  # a model that answered in text: the session goes on all the same
            messages.append({"role": "user", "content": f"Go on. part {k} " * 100})


def main() -> None:
    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.journal import read_journal
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.modelkit.build import build_model, build_tokenizer, bundled_corpus

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/bench-gateway"))
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--model", help="a local HF dir or packaged model (default: the kit Llama, built here)")
    ap.add_argument("--backend", default=None, help="hf | scripted | openai:URL[,URL...] (`vllm serve` of --model; "
                                                   "default: scripted)")
    ap.add_argument("--tokenizer", default=None, help="with --model: its tokenizer dir, when not inside it")
    ap.add_argument("--upstream-model", default=None, help="with openai:URL: the servers' --served-model-name")
    ap.add_argument("--system-chars", type=int, default=60000)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    args = ap.parse_args()
    if args.model is None:
        kit = args.out / "kit"
        if not (kit / "model" / "config.json").exists():
            build_model(kit / "model", build_tokenizer(kit / "tok"), max_positions=65536)
        model, tokenizer = str(kit / "model"), str(kit / "tok")
    else:
        model, tokenizer = args.model, args.tokenizer
    (args.out / "script.yaml").parent.mkdir(parents=True, exist_ok=True)
    (args.out / "script.yaml").write_text(SCRIPT)
    backend = args.backend if args.backend in ("hf",) or (args.backend or "").startswith("openai:") \
        else f"scripted:{args.out / 'script.yaml'}"
    corpus = "\n\n".join(bundled_corpus()) + "\n\n"
    # 60,000 characters: with the tools, about Claude Code's first prompt
    system = (corpus * (args.system_chars // len(corpus) + 1))[:args.system_chars]
    rows = {}
    for concurrency in (1, 8):
        out = args.out / f"c{concurrency}"
        shutil.rmtree(out, ignore_errors=True)  # a former run's journals would be read as this one's
        gw = build_gateway(model, backend, out, tokenizer=tokenizer, max_new_tokens=args.max_new_tokens,
                           upstream_model=args.upstream_model)
        trips: list[tuple[str, int, float]] = []
        with BackgroundServer(gw) as url:
            session(url, -1, 2, system, [])  # warm-up (first forward, first template render)
            threads = [threading.Thread(target=session, args=(url, k, args.calls, system, trips)) for k in range(concurrency)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
        records = {(r["session"], r["seq"]): r for p in sorted((out / "sessions").glob("bench-[0-9]*"))
                   for r in read_journal(p)[0] if r.get("kind") == "call"}
        matched = [(trip, records[(sid, seq)]) for sid, seq, trip in trips]

        def pct(xs: list[float]) -> dict[str, float]:
            xs = sorted(xs)
            return {"p50": round(1000 * xs[len(xs) // 2], 1), "p95": round(1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1)}

        rows[concurrency] = {
            "calls": len(matched), "wall_s": round(wall, 2),
            "prompt_tokens_mean": round(statistics.mean(len(r["context_tokens"]) for _, r in matched)),
            "round_trip_ms": pct([t for t, _ in matched]),
            "backend_ms": pct([r["sample_s"] for _, r in matched]),
            "added_ms": pct([t - r["sample_s"] for t, r in matched]),  # the gateway, as the client sees it
            "added_in_server_ms": pct([r["latency_s"] - r["sample_s"] for _, r in matched]),
        }
        rows[concurrency] |= {"model": model, "backend": backend.partition(":")[0]}
        print(concurrency, json.dumps(rows[concurrency]), flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

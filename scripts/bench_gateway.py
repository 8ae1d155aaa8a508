"""The gateway's added latency per call: the client's round trip minus the backend's own share.

    python scripts/bench_gateway.py --out runs/bench-gateway

Sessions shaped like Claude Code's (a 60,000-character system prompt, 12 tools — about 28K tokens of the
kit tokenizer, as Claude Code's first request — each call adding a tool call and a ~2,000-character result) speak Anthropic Messages (streaming) to a gateway serving the
kit Llama (65,536 positions) with the ``scripted`` backend. Per call, the backend's share is the
``sample_s`` the gateway journals (the backend call, a serial backend's queue included); what remains
of the round trip is the gateway: HTTP, parsing, rendering with the chat template, tokenizing,
fsyncing the journal, the SSE stream. p50/p95 at 1 and 8 concurrent sessions, default threads.
"""

from __future__ import annotations

import argparse
import json
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
        if not uses:
            break
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                   "content": f"part {k} " * 250}]}]


def main() -> None:
    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.journal import read_journal
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.modelkit.build import build_model, build_tokenizer, bundled_corpus

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/bench-gateway"))
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    kit = args.out / "kit"
    if not (kit / "model" / "config.json").exists():
        build_model(kit / "model", build_tokenizer(kit / "tok"), max_positions=65536)
    (args.out / "script.yaml").write_text(SCRIPT)
    corpus = "\n\n".join(bundled_corpus()) + "\n\n"
    system = (corpus * (60000 // len(corpus) + 1))[:60000]  # with the tools, about Claude Code's first prompt
    rows = {}
    for concurrency in (1, 8):
        out = args.out / f"c{concurrency}"
        gw = build_gateway(str(kit / "model"), f"scripted:{args.out / 'script.yaml'}", out, tokenizer=str(kit / "tok"))
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
        print(concurrency, json.dumps(rows[concurrency]), flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

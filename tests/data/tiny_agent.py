"""A minimal agent harness for tests (``harness=cmd:python tests/data/tiny_agent.py``): OpenAI Chat
Completions through the ``openai`` SDK, two tools (``read_file``, ``write_file``) run in the working
directory, at most 6 turns. Like OpenCode it compacts: once a reply's ``usage.prompt_tokens`` passes
``$TINY_AGENT_COMPACT_AT`` it asks for a summary (with OpenCode's summarization prompt, so the gateway
knows the call) and goes on from the summary alone. Its last reply is also written to ``reply.txt``
(what a verifier can score). A prompt containing ``HANG`` makes it sleep (a harness that never
finishes); ``$TINY_AGENT_SLEEP`` seconds pass before each call (a slow harness)."""

import json
import os
import time
from pathlib import Path

from openai import OpenAI

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]}}},
]
SYSTEM = "You are a tiny agent. Use the tools, then answer."


def run_tool(name, args):
    path = Path(args.get("path", ""))
    if path.is_absolute() or ".." in path.parts:
        return "error: paths are relative to the working directory"
    if name == "read_file":
        return path.read_text() if path.exists() else f"error: {path} does not exist"
    path.write_text(args.get("content", ""))
    return f"wrote {len(args.get('content', ''))} characters to {path}"


def main():
    prompt = os.environ["MEMORYWALKER_PROMPT"]
    if "HANG" in prompt:
        time.sleep(3600)
    client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    model, compact_at = os.environ["MEMORYWALKER_MODEL"], int(os.environ.get("TINY_AGENT_COMPACT_AT", "0"))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    for _ in range(6):
        time.sleep(float(os.environ.get("TINY_AGENT_SLEEP", "0")))
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=64)
        msg = r.choices[0].message
        calls = msg.tool_calls or []
        messages.append({"role": "assistant", "content": msg.content or "",
                         **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
        if not calls:
            break
        for c in calls:
            try:
                out = run_tool(c.function.name, json.loads(c.function.arguments))
            except (ValueError, OSError) as e:
                out = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
        if compact_at and r.usage.prompt_tokens > compact_at:
            s = client.chat.completions.create(model=model, max_tokens=64, messages=[
                {"role": "system", "content": "You are a context summarization agent."},
                {"role": "user", "content": json.dumps(messages[1:])}])
            messages = [messages[0], {"role": "user", "content": prompt},
                        {"role": "user", "content": "Summary of the work so far: " + (s.choices[0].message.content or "")}]
    Path("reply.txt").write_text(messages[-1].get("content") or "")
    print(messages[-1].get("content", ""))


if __name__ == "__main__":
    main()

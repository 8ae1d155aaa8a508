"""``memorywalker gateway``: serve a model to real harnesses and record, token for token, what they deliver."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from memorywalker.errors import InputError
from memorywalker.gateway.harnesses import settings_text
from memorywalker.render import Renderer
from memorywalker.render.chat_templates import NAMES as TEMPLATE_NAMES
from memorywalker.render.chat_templates import use_chat_template
from memorywalker.render.tool_formats import FORMATS

console = Console(stderr=True)


def build_gateway(model: str, backend: str, out: Path, *, tokenizer: str | None = None, dtype: str = "float32",
                  temperature: float = 1.0, max_new_tokens: int = 512, seed: int = 0, harness: str | None = None,
                  keep_requests: bool = True, redact: bool = False, upstream_model: str | None = None,
                  chat_template: str | None = None, tool_parser: str | None = None, lm=None, tok=None):
    """A :class:`~memorywalker.gateway.core.Gateway` for ``model`` behind ``backend`` (journals left by a
    killed gateway in ``out`` are finalized first)."""
    from memorywalker.gateway.backends import make_backend  # lazy: the command's machinery, only when it runs
    from memorywalker.gateway.core import Gateway, finalize_all  # lazy: as above
    from memorywalker.train.inputs import model_positions  # lazy: as above
    from memorywalker.train.model import resolve_dirs  # lazy: as above (torch)

    if tool_parser is not None and tool_parser not in FORMATS:  # before a model loads
        raise InputError(f"--tool-parser {tool_parser}: not a known tool-call format ({', '.join(FORMATS)})")
    finalize_all(out)
    if tok is None:
        from transformers import AutoTokenizer  # lazy: transformers (~1 s), only when the command runs

        model_dir, tok_dir = resolve_dirs(model, tokenizer)
        if not tok_dir.is_dir():
            raise FileNotFoundError(f"{tok_dir} is not a local directory (nothing is downloaded)")
        tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    label = use_chat_template(tok, chat_template)
    renderer = Renderer(tok)
    positions = (lm.config.max_position_embeddings if lm is not None else model_positions(model)) or 8192
    kind = backend.partition(":")[0]
    model_dir = str(resolve_dirs(model, tokenizer)[0]) if lm is None else None
    sampler = make_backend(backend, model_dir=model_dir if kind != "openai" else str(model), renderer=renderer,
                           temperature=temperature, dtype=dtype, max_new_tokens=max_new_tokens, model=lm,
                           max_positions=positions, upstream_model=upstream_model)
    return Gateway(renderer, sampler, out, model_name=Path(str(model)).name or str(model), max_positions=positions,
                   max_new_tokens=max_new_tokens, seed=seed, harness=harness, keep_requests=keep_requests,
                   temperature=temperature if temperature > 0 else 1.0, redact=redact, tool_parser=tool_parser,
                   chat_template=label)


def gateway(
    model: str | None = typer.Option(None, help="(Required to serve.) The served model: a local Hugging Face dir (its tokenizer and chat "
                                            "template render every request), or a packaged model's name."),
    out: Path | None = typer.Option(None, help="(Required to serve.) Where the records go: sessions/*.jsonl (journals, one line per call), "
                                       "trajectories.jsonl (one per session line, written when a session idles "
                                       "or the gateway stops: Ctrl-C or SIGTERM)."),
    backend: str = typer.Option("hf", help="hf | vllm | openai:URL[,URL...] (`vllm serve` processes of the same "
                                           "model: token ids in, ids and logprobs out; a session's calls stay on one "
                                           "server, all sessions in flight at once) | scripted:FILE"),
    port: int = typer.Option(8421, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs --api-key."),
    api_key: str | None = typer.Option(None, help="Require this key (x-api-key or Authorization: Bearer)."),
    tokenizer: str | None = typer.Option(None, help="Tokenizer dir (default: the model's)."),
    chat_template: str | None = typer.Option(None, help="Render with this template instead of the model's: a Jinja "
                                             f"file or {', '.join(TEMPLATE_NAMES)} (the records name it)."),
    tool_parser: str | None = typer.Option(None, help="The tool-call format to parse responses with (default: the "
                                           f"one the template writes): {', '.join(FORMATS)}."),
    upstream_model: str | None = typer.Option(None, help="With openai:URL: the name the server serves the model "
                                              "under (vllm serve --served-model-name; default: the --model path)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (the recorded logprobs are of it)."),
    max_new_tokens: int = typer.Option(512, help="Cap on each response (below the client's max_tokens)."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    seed: int = typer.Option(0, help="Sampling seed (each call gets its own, derived from it)."),
    idle: float = typer.Option(300.0, help="Seconds without a call after which a session is finalized."),
    keep_requests: bool = typer.Option(True, help="Keep each raw request body in the journal (for importer "
                                                  "cross-checks)."),
    redact: bool = typer.Option(False, "--redact", help="Write records through the importers' redaction (secrets, "
                                "e-mails, home paths...); a redacted call is re-tokenized and keeps no logprobs."),
    settings: bool = typer.Option(False, "--settings", help="Print how to point each harness at this gateway "
                                                            "and exit."),
    finalize: bool = typer.Option(False, "--finalize", help="Only finalize journals left in --out (a killed "
                                                            "gateway) and exit."),
):
    """Serve MODEL over Anthropic Messages, OpenAI Responses and Chat Completions; record every call.

    Point Claude Code, Codex CLI or OpenCode at it (--settings prints how). Each call's context is
    rendered once by the model's chat template; the ids sent to the backend are the call's
    context_tokens, the sampled ids and their logprobs its response_tokens / rollout_logprobs."""
    from memorywalker.gateway.core import finalize_all  # lazy: the command's machinery, only when it runs
    from memorywalker.gateway.server import BackgroundServer, check_bind  # lazy: uvicorn, only when run

    if settings:
        from memorywalker.train.inputs import model_positions  # lazy: as above

        name = Path(model).name if model else "MODEL"
        window = model_positions(model) if model else None  # each harness is told the served model's window
        sys.stdout.write(settings_text(f"http://{host}:{port}", name, api_key or "memorywalker", window) + "\n")
        return
    if out is None:
        raise typer.BadParameter("--out is required (where the records go)")
    if model is None and not finalize:
        raise typer.BadParameter("--model is required (the served model's directory)")
    if finalize:
        n = finalize_all(out)
        console.print(f"{n} trajectories written to {out / 'trajectories.jsonl'}")
        return
    check_bind(host, api_key)
    gw = build_gateway(model, backend, out, tokenizer=tokenizer, dtype=dtype, temperature=temperature,
                       max_new_tokens=max_new_tokens, seed=seed, keep_requests=keep_requests, redact=redact,
                       upstream_model=upstream_model, chat_template=chat_template, tool_parser=tool_parser)
    lines = threading.Lock()

    def on_call(record: dict) -> None:
        with lines:
            console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {record['session'][:24]:24} #{record['seq']:<3} "
                          f"{record['dialect']:9} {record['purpose']:9} {len(record['context_tokens']):>6} → "
                          f"{len(record['response_tokens']):<5} {record['latency_s']:.2f}s"
                          + (f" [yellow]{record['parse_error']}[/yellow]" if record.get("parse_error") else ""))

    server = BackgroundServer(gw, host=host, port=port, api_key=api_key, idle_s=idle, on_call=on_call)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, and what kill, docker stop and systemd send; before
        signal.signal(sig, lambda *_: stop.set())  # the port opens, so that no call is served unguarded
    url = server.start()
    console.print(f"memorywalker gateway on {url} serving {model} ({backend}), {gw.max_positions} positions, "
                  f"tool calls parsed by '{gw.tool_parser}'"
                  + (" (the template has no tool-call syntax known here: responses go back as text)"
                     if gw.tool_parser == "text" else "") + "; "
                  f"records in {out}. `memorywalker gateway --settings --port {port}` prints harness settings. "
                  "Ctrl-C stops.")
    while not stop.wait(15):
        table = _table(gw)
        if table:
            console.print(table)
    n = server.stop()  # every open session finalized into trajectories.jsonl
    console.print(f"stopped: {gw.stats['calls']} calls, {gw.stats['errors']} errors; {n} trajectories written to "
                  f"{out / 'trajectories.jsonl'}")


def _table(gw):
    if not gw.sessions:
        return None
    table = Table(title="open sessions")
    for c in ("session", "source", "calls", "compactions", "tokens"):
        table.add_column(c, justify="left" if c in ("session", "source") else "right")
    for s in list(gw.sessions.values()):
        table.add_row(s.id[:36], s.source, str(s.calls), str(s.compactions), f"{s.tokens:,}")
    return table


def register(app: typer.Typer) -> None:
    app.command()(gateway)

"""Real harnesses pointed at the gateway: their settings, and one session run in a fresh workdir.

Each :class:`Harness` knows its command line for one non-interactive task, the environment and config
files that send its model calls to the gateway with no account, and the setting that moves its own
auto-compaction threshold (so a short session reaches it). Checked with the pinned npm versions
(:data:`PINNED`), offline against 127.0.0.1; ``memorywalker gateway --settings`` prints them.

* ``claude-code`` — ``claude -p PROMPT --model NAME``, ``ANTHROPIC_BASE_URL``; Anthropic Messages with
  header ``X-Claude-Code-Session-Id``. Compaction: ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` (the window it
  assumes) and ``CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`` (the percentage that triggers), against the ``usage``
  the gateway reports.
* ``codex`` — ``codex exec`` with a ``model_providers.local`` entry (``wire_api="responses"``) and
  ``CODEX_HOME``; OpenAI Responses with header ``session-id``. Compaction: ``model_auto_compact_token_limit``.
* ``opencode`` — ``opencode run`` with an ``opencode.json`` provider (``@ai-sdk/openai-compatible``,
  ``baseURL``, the model's ``limit.context``); Chat Completions with header ``x-session-id``; a
  title-generation call comes first. Compaction: ``limit.context`` (it compacts once a prompt passes about
  ``limit.context - limit.output``). It takes its project directory from ``$PWD``.
* ``cmd:COMMAND`` — any other agent: ``bash -c COMMAND`` in the workdir, the task in
  ``$MEMORYWALKER_PROMPT``, the gateway in ``$MEMORYWALKER_BASE_URL`` (also ``OPENAI_BASE_URL`` ending in
  ``/v1`` and ``ANTHROPIC_BASE_URL``), the model's name in ``$MEMORYWALKER_MODEL``. No compaction setting.

``sandbox=True`` runs the process under bubblewrap (``bwrap``): the filesystem read-only (``/tmp``
included: ``$TMPDIR`` is inside the session's HOME) but for the session's workdir and HOME, mounted at
the same paths in every session (:data:`SANDBOX_WORK`, :data:`SANDBOX_HOME`) so that the prompts of one
task's sessions are identical token for token; the process sees its own PIDs and dies with its parent.
The network is shared (the gateway is on loopback): the sandbox guards the machine's files, not its
network.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from memorywalker.errors import InputError

PINNED = {"claude-code": "@anthropic-ai/claude-code@2.1.328", "codex": "@openai/codex@0.169.0",
          "opencode": "opencode-ai@1.18.33"}
BINARIES = {"claude-code": "claude", "codex": "codex", "opencode": "opencode"}
SANDBOX_WORK, SANDBOX_HOME = Path("/tmp/mw/work"), Path("/tmp/mw/home")
# Claude Code reads a window under 100k tokens as 100k: for such a model it is told to compact at this
# percentage of the model's positions (its own default percentage applies to larger windows).
WINDOW_FILL = 80


def is_known(harness: str) -> bool:
    """A harness this module can run: a pinned one, or ``cmd:COMMAND``."""
    return harness in PINNED or (harness.startswith("cmd:") and bool(harness[4:].strip()))


def sandbox_available() -> str | None:
    """The bubblewrap binary, or None where it is not installed (``apt-get install bubblewrap``)."""
    return shutil.which("bwrap")


def sandboxed(argv: list[str], workdir: Path, home: Path) -> list[str]:
    """``argv`` under bubblewrap: this machine's files read-only, ``workdir`` and ``home`` mounted read-write
    at :data:`SANDBOX_WORK` and :data:`SANDBOX_HOME` (``$TMPDIR`` inside the HOME), a private PID namespace.
    The mount points are made here first (empty directories): a read-only root cannot get new ones."""
    bwrap = sandbox_available()
    if bwrap is None:
        raise FileNotFoundError("bwrap (bubblewrap) is not installed: `apt-get install bubblewrap`, or run unsandboxed")
    for d in (SANDBOX_WORK, SANDBOX_HOME):
        d.mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(workdir), str(SANDBOX_WORK), "--bind", str(home), str(SANDBOX_HOME),
            "--chdir", str(SANDBOX_WORK), "--setenv", "TMPDIR", str(SANDBOX_HOME / "tmp"),
            "--unshare-pid", "--die-with-parent", "--", *argv]


@dataclass
class Setup:
    """What a harness process needs: argv, environment additions, files to write (path → text)."""

    argv: list[str]
    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)


def find_binary(harness: str, bin_dir: str | os.PathLike | None = None) -> str:
    """The harness's executable: in ``bin_dir``, ``$MEMORYWALKER_HARNESS_BIN``, or on PATH (``bash`` for ``cmd:``)."""
    if harness.startswith("cmd:"):
        return shutil.which("bash") or "bash"
    name = BINARIES[harness]
    for d in (bin_dir, os.environ.get("MEMORYWALKER_HARNESS_BIN")):
        if d and (Path(d) / name).exists():
            return str(Path(d) / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} ({harness}) not found: `npm install {PINNED[harness]}` and put its "
                                "node_modules/.bin on PATH or in MEMORYWALKER_HARNESS_BIN")
    return found


def setup(harness: str, prompt: str, *, url: str, model: str, key: str, workdir: Path, home: Path,
          compact_tokens: int | None = None, binary: str | None = None, window: int | None = None) -> Setup:
    """How to run ``harness`` on ``prompt`` in ``workdir`` against the gateway at ``url``.

    ``window``: the served model's positions, told to the harness as its context window (Claude Code's
    ``CLAUDE_CODE_AUTO_COMPACT_WINDOW``, Codex's ``model_context_window``, OpenCode's ``limit.context``), so
    that it compacts before the model's positions run out instead of assuming a window of 1M tokens and
    meeting the gateway's 400. ``compact_tokens``: make the harness's own auto-compaction trigger once a
    prompt passes about that many tokens (None: its default for the window).
    """
    exe = binary or BINARIES.get(harness, "bash")
    if harness == "claude-code":
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}
        if compact_tokens is None and window is not None and window < 100_000:
            compact_tokens = window * WINDOW_FILL // 100  # its default percentage is of a window of at least 100k
        if compact_tokens is not None:
            # It reads a window under 100k as 100k: a percentage of a window of at least 100k tokens. The window
            # variable serves only its auto-compaction: the two place the trigger.
            pct = max(1, min(99, compact_tokens * 100 // 100_000))
            env |= {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(compact_tokens * 100 // pct),
                    "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(pct)}
        elif window is not None:
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(window)
        # --dangerously-skip-permissions refuses to run as root; allowing the tools by name works for anyone.
        return Setup([exe, "-p", prompt, "--model", model, "--allowedTools", "Read,Bash,Write,Edit,Glob,Grep,LS"], env)
    if harness == "codex":
        provider = f'{{name="memorywalker",base_url="{url}/v1",wire_api="responses",env_key="OPENAI_API_KEY"}}'
        argv = [exe, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "-c", "model_provider=memorywalker", "-c", f"model_providers.memorywalker={provider}", "-m", model]
        if window is not None:
            argv += ["-c", f"model_context_window={window}"]
        if compact_tokens is not None:
            argv += ["-c", f"model_auto_compact_token_limit={compact_tokens}"]
        codex_home = home / ".codex"
        return Setup([*argv, prompt], {"OPENAI_API_KEY": key, "CODEX_HOME": str(codex_home)},
                     {codex_home / ".keep": ""})
    if harness == "opencode":
        # It compacts once a prompt passes about limit.context - limit.output: its window is its only lever.
        context = compact_tokens + 4096 if compact_tokens is not None else window or 1_000_000
        config = {"$schema": "https://opencode.ai/config.json", "model": f"memorywalker/{model}",
                  "provider": {"memorywalker": {"npm": "@ai-sdk/openai-compatible", "name": "memorywalker",
                                                "options": {"baseURL": f"{url}/v1", "apiKey": key},
                                                "models": {model: {"name": model,
                                                                   "limit": {"context": context, "output": 4096}}}}},
                  "permission": {"*": "allow"}}
        return Setup([exe, "run", prompt], {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"},
                     {workdir / "opencode.json": json.dumps(config, indent=2)})
    if harness.startswith("cmd:"):
        return Setup([exe, "-c", harness[4:]],
                     {"MEMORYWALKER_PROMPT": prompt, "MEMORYWALKER_BASE_URL": url, "MEMORYWALKER_MODEL": model,
                      "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": key, "ANTHROPIC_BASE_URL": url,
                      "ANTHROPIC_API_KEY": key})
    raise InputError(f"unknown harness {harness!r}; valid: {sorted(PINNED)} or cmd:COMMAND")


def settings_text(url: str, model: str, key: str, window: int | None = None) -> str:
    """The settings of every harness for a gateway at ``url`` serving a model of ``window`` positions (what
    ``memorywalker gateway --settings`` prints)."""
    out = []
    for name in PINNED:
        s = setup(name, "<task>", url=url, model=model, key=key, workdir=Path("."), home=Path("~"), window=window)
        out.append(f"# {name} ({PINNED[name]})")
        out += [f"export {k}={v}" for k, v in s.env.items()]
        for path, text in s.files.items():
            if text:
                out.append(f"cat > {path} <<'EOF'\n{text}\nEOF")
        out.append(" ".join(a if a.isidentifier() or a.startswith("-") else repr(a) for a in s.argv) + "\n")
    return "\n".join(out)


@dataclass
class HarnessRun:
    harness: str
    workspace: Workspace
    returncode: int | None  # None: killed (at the deadline, or when run_harness's ``stop()`` said so)
    seconds: float
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def workdir(self) -> Path:
        return self.workspace.workdir


@dataclass
class Workspace:
    """A session's fresh workdir and private HOME, and the paths the process sees them at (the same
    unless sandboxed)."""

    workdir: Path
    home: Path
    sandbox: bool = False

    @property
    def inner_workdir(self) -> Path:
        return SANDBOX_WORK if self.sandbox else self.workdir

    @property
    def inner_home(self) -> Path:
        return SANDBOX_HOME if self.sandbox else self.home

    def outer(self, path: Path) -> Path:
        """Where a path the process sees lies on this machine."""
        for inner, outer in ((self.inner_workdir, self.workdir), (self.inner_home, self.home)):
            if path == inner or inner in path.parents:
                return outer / path.relative_to(inner)
        return path

    def wrap(self, argv: list[str]) -> tuple[list[str], Path]:
        """(argv to run, cwd to run it in) for a command of this session."""
        return (sandboxed(argv, self.workdir, self.home) if self.sandbox else argv), self.workdir

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """This machine's environment without provider keys, HOME and XDG dirs private, plus ``extra``."""
        home, work = self.inner_home, self.inner_workdir
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_"))}
        return env | {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                      "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
                      "XDG_STATE_HOME": str(home / ".local/state"), "NO_COLOR": "1",
                      "PWD": str(work)} | extra  # OpenCode takes its project dir from $PWD


def workspace(workdir: Path | None = None, *, sandbox: bool = False, prefix: str = "mw-") -> Workspace:
    """A fresh ``workdir`` (a new temporary one when None) and its HOME beside it."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix=prefix)).resolve()  # bubblewrap binds absolute paths only
    home = workdir.parent / f"{workdir.name}.home"
    workdir.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    return Workspace(workdir, home, sandbox)


def run_harness(harness: str, prompt: str, *, url: str, model: str, key: str = "memorywalker",
                files: dict[str, str] | None = None, deadline_s: float = 600, compact_tokens: int | None = None,
                bin_dir: str | None = None, workdir: Path | None = None, sandbox: bool = False,
                stop: Callable[[], bool] | None = None, window: int | None = None) -> HarnessRun:
    """Run one ``harness`` session on ``prompt`` in a fresh workdir (``files`` placed in it) with a private
    HOME, killed (its whole process group) at ``deadline_s``, or as soon as ``stop()`` says so (checked every
    half second: its model backend is gone, and a harness would retry it until its deadline); under
    bubblewrap with ``sandbox``."""
    binary = find_binary(harness, bin_dir)
    ws = workspace(workdir, sandbox=sandbox, prefix=f"mw-{harness.partition(':')[0]}-")
    for name, text in (files or {}).items():
        (ws.workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (ws.workdir / name).write_text(text)
    s = setup(harness, prompt, url=url, model=model, key=key, workdir=ws.inner_workdir, home=ws.inner_home,
              compact_tokens=compact_tokens, binary=binary, window=window)
    for path, text in s.files.items():
        path = ws.outer(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    argv, cwd = ws.wrap(s.argv)
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=ws.env(s.env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, errors="replace")
    code: int | None = None
    while True:
        left = deadline_s - (time.monotonic() - started)
        try:
            stdout, stderr = proc.communicate(timeout=max(0.0, min(left, 0.5) if stop else left))
            code = proc.returncode
            break
        except subprocess.TimeoutExpired:
            if (stop is not None and stop()) or time.monotonic() - started >= deadline_s:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
                break
    return HarnessRun(harness, ws, code, time.monotonic() - started, stdout, stderr)


@dataclass
class CapturedSession:
    """One harness session run through a gateway: the process, and the trajectories its calls became."""

    run: HarnessRun
    trajectories: list  # list[Trajectory], in the order the gateway wrote them
    records: Path  # the gateway's trajectories.jsonl


def capture(harness: str, prompt: str, gateway, *, model: str = "kit", files: dict[str, str] | None = None,
            deadline_s: float = 600, compact_tokens: int | None = None, bin_dir: str | None = None) -> CapturedSession:
    """Serve ``gateway`` on a free loopback port, run one ``harness`` session against it, stop (which
    finalizes the session) and return the trajectories it wrote."""
    from memorywalker.gateway.server import BackgroundServer  # lazy: uvicorn; stdlib-only at CLI start
    from memorywalker.records import read_trajectories  # lazy: as above (pydantic)

    records = gateway.out / "trajectories.jsonl"
    seen = {t.id for t in read_trajectories(records)} if records.exists() else set()
    with BackgroundServer(gateway) as url:
        run = run_harness(harness, prompt, url=url, model=model, files=files, deadline_s=deadline_s,
                          compact_tokens=compact_tokens, bin_dir=bin_dir, window=gateway.max_positions)
    new = [t for t in read_trajectories(records) if t.id not in seen] if records.exists() else []
    return CapturedSession(run, new, records)

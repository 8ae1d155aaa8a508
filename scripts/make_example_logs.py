"""Write the example harness logs a fresh clone ships (``examples/harness-logs/``): real Codex CLI and
OpenCode sessions, each harness's own log of one session it ran through the gateway.

    MEMORYWALKER_HARNESS_BIN=.../node_modules/.bin python scripts/make_example_logs.py

Codex and OpenCode (``--harness claude-code`` too, for a log kept on your machine: examples/README.md
says why it is not shipped) run once each, offline, under bubblewrap
(the same paths in every run: ``/tmp/mw/work``, ``/tmp/mw/home``), on the shipped scripted session (read
a file, list the files, write one, show it, answer) with its own auto-compaction moved low, so that each
log holds at least one compaction. The model's words are the script's; everything else — the log's
format, the records, the compaction, the ids — is what the harness itself wrote. What is kept:

* ``claude-code/<session>.jsonl`` (only when asked): Claude Code's ``~/.claude/projects/<project>/<session>.jsonl``;
* ``codex/rollout-<...>.jsonl``: Codex's ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``;
* ``opencode/opencode.db``: OpenCode's SQLite database, checkpointed into one file.

``memorywalker import opencode examples/harness-logs/opencode/opencode.db -o sessions.jsonl`` (the README's
first way in) reads one; ``tests/test_readme_first_screen.py`` runs it as a fresh clone would.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness_sessions import PROMPT  # noqa: E402 — the shipped scripted session's task

COMPACT_AT = {"claude-code": 30250, "codex": 15000, "opencode": 17080}  # each compacts at least once


def own_log(harness: str, home: Path) -> list[Path]:
    """The files of ``harness``'s own log under the session's HOME."""
    found = {"claude-code": sorted((home / ".claude" / "projects").glob("*/*.jsonl")),
             "codex": sorted((home / ".codex" / "sessions").glob("*/*/*/rollout-*.jsonl")),
             "opencode": sorted((home / ".local" / "share" / "opencode").glob("opencode.db"))}[harness]
    if not found:
        raise SystemExit(f"{harness} wrote no log under {home}")
    return found


def keep(harness: str, files: list[Path], out: Path) -> None:
    """Copy ``files`` into ``out/harness`` (OpenCode's database with its WAL folded in: one file)."""
    dest = out / harness
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in files:
        if harness == "opencode":
            src = sqlite3.connect(f)
            target = sqlite3.connect(dest / f.name)
            src.backup(target)  # reads through the WAL; the copy has none
            target.execute("VACUUM")
            target.close()
            src.close()
        else:
            shutil.copy2(f, dest / f.name)


def main() -> None:
    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.harnesses import PINNED, run_harness, sandbox_available
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.modelkit import default_kit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "examples" / "harness-logs")
    ap.add_argument("--work", type=Path, default=Path("runs/example-logs"))
    ap.add_argument("--harness", action="append", choices=sorted(PINNED),
                    help="default: codex and opencode (Claude Code's log holds its own prompts: examples/README.md)")
    args = ap.parse_args()
    if sandbox_available() is None:
        raise SystemExit("bwrap is needed (the logs hold the sandbox's fixed paths): apt-get install bubblewrap")
    tok, model = default_kit()  # 65,536 positions: the harnesses' prompts are 15.6K–30K kit tokens
    for harness in args.harness or ["codex", "opencode"]:
        script = resources.files("memorywalker.data").joinpath(f"harness-scripts/{harness}.yaml")
        gw = build_gateway(str(model), f"scripted:{script}", args.work / harness / "gateway", tokenizer=str(tok),
                           harness=harness)
        work = args.work / harness / "work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(work.parent / f"{work.name}.home", ignore_errors=True)
        with BackgroundServer(gw) as url:
            run = run_harness(harness, PROMPT, url=url, model="kit", files={"notes.txt": "hello\n"},
                              deadline_s=300, compact_tokens=COMPACT_AT[harness], workdir=work, sandbox=True)
        if not run.ok:
            raise SystemExit(f"{harness} exited {run.returncode}: {run.stderr[-2000:]}")
        keep(harness, own_log(harness, run.workspace.home), args.out)
        print(f"{harness}: {run.seconds:.0f} s, kept {', '.join(p.name for p in (args.out / harness).iterdir())}")


if __name__ == "__main__":
    main()

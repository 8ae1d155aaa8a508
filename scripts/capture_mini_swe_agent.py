"""Run mini-swe-agent through the gateway and keep both sides: its own trajectory file and the capture.

    pip install mini-swe-agent==2.4.0          # in a venv of its own: MINI=/path/to/venv/bin/mini
    MINI=.../bin/mini python scripts/capture_mini_swe_agent.py --out tests/data/mini-swe-agent

Three sessions of one task (read notes.txt, write the number in it to answer.txt), each answered by a
gateway script in ``--out`` and served by the kit model: ``tools`` (mini.yaml: the bash tool),
``textbased`` (mini_textbased.yaml, ``--model-class litellm_textbased``: the command in a fenced block)
and ``format-error`` (mini.yaml answered in text, so the agent rejects each response until it gives
up). Each writes ``<mode>/traj.json`` (mini's ``-o``) and ``<mode>/capture.jsonl`` (the gateway's
trajectories). ``tests/test_import_mini_swe_agent.py`` imports the first and compares it with the second.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

MODES = {"tools": ("mini.yaml", "", "script-tools.yaml"),
         "textbased": ("mini_textbased.yaml", "--model-class litellm_textbased", "script-text.yaml"),
         "format-error": ("mini.yaml", "", "script-text.yaml")}
PROMPT = "Read notes.txt and write the number in it to answer.txt."


def main() -> None:
    from memorywalker.cli.gateway_cmd import build_gateway
    from memorywalker.gateway.harnesses import run_harness
    from memorywalker.gateway.server import BackgroundServer
    from memorywalker.modelkit import default_kit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/mini-swe-agent"))
    ap.add_argument("--mini", default=os.environ.get("MINI") or shutil.which("mini"))
    args = ap.parse_args()
    if not args.mini:
        raise SystemExit("mini-swe-agent's `mini` not found: pip install mini-swe-agent==2.4.0, or give --mini")
    tok, model = default_kit()
    for mode, (config, extra, script) in MODES.items():
        work = Path(tempfile.mkdtemp(prefix=f"mini-{mode}-"))
        gw = build_gateway(str(model), f"scripted:{args.out / script}", work / "gw", tokenizer=str(tok))
        traj = work / "work" / "traj.json"  # written inside the session's workdir (the sandbox's one writable place)
        # No cost lookup (offline) and no first-run configuration prompt; the gateway URL from the harness env.
        cmd = (f"MSWEA_COST_TRACKING=ignore_errors LITELLM_LOCAL_MODEL_COST_MAP=True MSWEA_CONFIGURED=true "
               f"{args.mini} -y --cost-limit 0 --exit-immediately -m openai/kit {extra} -c {config} "
               f"-c model.model_kwargs.api_base=$OPENAI_BASE_URL -c model.model_kwargs.api_key=x "
               f'-t "$MEMORYWALKER_PROMPT" -o traj.json')
        with BackgroundServer(gw) as url:
            run = run_harness("cmd:" + cmd, PROMPT, url=url, model="kit", files={"notes.txt": "The number is 7.\n"},
                              deadline_s=120, workdir=work / "work", sandbox=True)
        if not traj.exists():
            raise SystemExit(f"{mode}: mini wrote no trajectory (exit {run.returncode}): {run.stdout[-2000:]}")
        (args.out / mode).mkdir(parents=True, exist_ok=True)
        shutil.copy(traj, args.out / mode / "traj.json")
        shutil.copy(work / "gw" / "trajectories.jsonl", args.out / mode / "capture.jsonl")
        print(f"{mode}: {run.seconds:.0f} s")


if __name__ == "__main__":
    main()

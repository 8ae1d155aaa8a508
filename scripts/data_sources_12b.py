"""The docs/data-sources.md numbers for schema augmentation, transfer and ACC (kit model, CPU, a few minutes).

    PYTHONPATH=src python scripts/data_sources_12b.py runs/ds12b
"""

import json
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from memorywalker.eval.evaluate import Candidate, EvalConfig
from memorywalker.eval.transfer import paired, report, transfer_rows
from memorywalker.metrics.stats import paired_bootstrap, paired_differences
from memorywalker.modelkit import default_kit
from memorywalker.recipes.sft import SFTConfig, train
from memorywalker.rollout import ExpertPolicy, HarnessConfig, WebSearchEnv, rollout
from memorywalker.samplers.hf import HFPolicy
from memorywalker.transforms.acc import compile_record, qa_accuracy
from memorywalker.transforms.augment import augment_record, make_schema_map

out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/ds12b")
SIZE = {"n_cities": 2, "n_companies": 3, "n_people": 3, "n_distractors": 2}
STEPS, N_TRAIN, N_EVAL = 150, 24, 12
tok_dir, model_dir = default_kit()
tok = AutoTokenizer.from_pretrained(tok_dir)
env = WebSearchEnv(0, world_size=SIZE)
expert, _ = rollout(env, ExpertPolicy(), tok, HarnessConfig("none"), suite="lookup", n=N_TRAIN, split="train")
augmented = [augment_record(t, make_schema_map(env.tools(), i), index=0) for i, t in enumerate(expert)]


results = {}


def sft(name, trajs):
    res = train(SFTConfig(model=str(model_dir), run_dir=str(out / name), method="radix", steps=STEPS,
                          batch_size=4, lr=3e-3, warmup_steps=5, max_tokens=4096, save_every=STEPS, seed=0),
                trajectories=trajs, progress=False)
    results[f"loss {name}"] = [round(float(res.metrics[0]["loss"]), 3), round(float(res.metrics[-1]["loss"]), 3)]
    return AutoModelForCausalLM.from_pretrained(res.final_dir).eval()


# --- augmentation: SFA/PRE/reward per transfer regime, plain vs plain + augmented --------------------------
cfg = EvalConfig(suites=("lookup",), n=N_EVAL, world_size=SIZE, max_steps=5, max_new_tokens=48, budget=1500)
rows, models = {}, {}
for name, data in (("sft", expert), ("sft+aug", expert + augmented)):
    m = models[name] = sft(name, data)
    cand = Candidate(name, HFPolicy.from_model(m, tok, temperature=0.0, max_new_tokens=48), tok, {})
    rows[name] = transfer_rows(cand, cfg, out / "transfer")
    results[name] = {r: {k: v[k] for k in ("acceptance", "sfa", "pre", "pre_calls", "proposals")}
                     for r, v in report(rows[name]).items()}
results["paired sft+aug - sft (95%)"] = {r: paired(rows["sft+aug"][r]["lookup"], rows["sft"][r]["lookup"], alpha=0.05)
                                         for r in rows["sft"]}

# --- ACC: compiled-QA-trained vs agent-SFT-trained, held-out compiled QA ---------------------------------
def compiled(split, n):
    trajs, _ = rollout(env, ExpertPolicy(), tok, HarnessConfig("none"), suite="lookup", n=n, split=split)
    return trajs, [r for t in trajs if (r := compile_record(t, env, tok, budget=1200, seed=0)[0])]


_, acc_train = compiled("train", N_TRAIN)
_, acc_test = compiled("test", N_EVAL)
acc_model = sft("acc", acc_train)
agent_model = models["sft"]  # agent SFT on the expert episodes the ACC records were compiled from
a, b = qa_accuracy(acc_model, tok, acc_test), qa_accuracy(agent_model, tok, acc_test)
mean, lo, hi = paired_bootstrap(paired_differences(a, b), alpha=0.05, resamples=10_000, seed=0)
results["acc"] = {"held_out_records": len(acc_test), "acc_trained": sum(a.values()) / len(a),
                  "agent_sft_trained": sum(b.values()) / len(b), "paired_difference": mean, "ci95": [lo, hi]}
(out / "results.json").write_text(json.dumps(results, indent=2))
print(json.dumps(results, indent=2))

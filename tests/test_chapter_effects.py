"""scripts/chapter_effects.py at its tiny and quick sizes: every section runs from the demo's own stages, and the
numbers its tables print are recomputed here from the episodes and records it wrote.

Tiny (default suite, about 1 minute on 2 cores with the students' run): the demo's stages 1-3 at the test's
size, two DAgger rounds with their retraining, behaviour cloning, two SFT runs evaluated in three regimes,
the GRPO teacher and its episodes, ACC's two arms. Quick (``-m slow``, in .ci/run): the
same at ``demo --quick``'s settings (8 held-out tasks, 80 expert episodes per harness), about 5 minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memorywalker.metrics.closed_loop import trial_row
from memorywalker.records import read_trajectories

SCRIPT = Path(__file__).parents[1] / "scripts" / "chapter_effects.py"


@pytest.fixture(scope="module", params=["tiny", pytest.param("quick", marks=pytest.mark.slow)])
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"chapter-{request.param}")
    res = subprocess.run([sys.executable, str(SCRIPT), "--size", request.param, "--seeds", "0", "--out", str(out)],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text()), res.stdout


def tasks(results: dict) -> int:
    """Held-out tasks per evaluation at the run's size (2 tiny, 8 quick)."""
    return results["config"]["eval_tasks"]


def accepted(path: Path) -> dict[str, float]:
    return {t.task.id: float(t.reward == 1.0) for t in read_trajectories(path)}


def test_dagger_and_behaviour_cloning_spend_the_same_labels_and_are_paired_by_task(run):
    """DAgger's budget is the labels it admitted over its rounds; behaviour cloning takes that many act calls
    from the expert's claude-code episodes that earned reward 1 (in file order), or all there are. The paired
    reward difference is the mean of DAgger's minus BC's acceptance over the same held-out tasks."""
    out, results, stdout = run
    d, n = results["seeds"]["0"]["dagger"], tasks(results)
    labels = sum(len(read_trajectories(out / "seed-0" / "dagger" / f"labels-{k}.jsonl")) for k in (1, 2))
    assert d["labels"] == labels == sum(r["admitted"] for r in d["rounds"])
    verified = [t for t in read_trajectories(out / "seed-0" / "demo" / "expert.jsonl")
                if t.meta["harness"]["name"] == "claude-code" and t.reward == 1.0]
    assert d["bc_labels"] == min(labels, sum(c.purpose == "act" for t in verified for c in t.calls))
    assert [r["beta"] for r in d["rounds"]] == [1.0, 0.0] and d["rounds"][0]["learner_states"] == 0
    a = accepted(out / "seed-0" / "dagger" / "eval-round-2.jsonl")
    b = accepted(out / "seed-0" / "eval-bc.jsonl")
    assert a.keys() == b.keys() and len(a) == n
    p = d["paired"]["acceptance"]
    assert p["tasks"] == n and p["difference"] == pytest.approx(sum(a[t] - b[t] for t in a) / n)
    assert p["ci"][0] <= p["difference"] <= p["ci"][1]
    tokens = {t.task.id: trial_row(t)["tokens"] for t in read_trajectories(out / "seed-0" / "eval-bc.jsonl")}
    mine = {t.task.id: trial_row(t)["tokens"] for t in read_trajectories(out / "seed-0" / "dagger" / "eval-round-2.jsonl")}
    assert d["paired"]["tokens"]["difference"] == pytest.approx(sum(mine[t] - tokens[t] for t in mine) / n)
    assert "DAgger against behaviour cloning" in stdout and "DAgger − BC reward: above 0 on" in stdout


def test_augmentation_is_evaluated_on_the_familiar_and_two_renamed_schemas(run):
    """One renamed copy per expert record (or its reason); both arms in the three transfer regimes on the
    same tasks; each regime's SFA difference is the mean over tasks of the per-task SFA differences."""
    from memorywalker.eval.transfer import per_task_sfa

    out, results, stdout = run
    a, n = results["seeds"]["0"]["augment"], tasks(results)
    assert a["copies"] + len(a["rejected"]) == a["records"] == len(read_trajectories(out / "seed-0" / "demo" / "expert.jsonl"))
    assert list(a["regimes"]) == ["new-tasks", "renamed-schema", "unfamiliar-tools"]
    for regime, r in a["regimes"].items():
        rows = {arm: [trial_row(t) for t in read_trajectories(out / "seed-0" / f"transfer-{arm}" /
                                                               f"{arm}-{regime}-recall-2.jsonl")] for arm in ("sft", "sft+aug")}
        plus, base = per_task_sfa(rows["sft+aug"]), per_task_sfa(rows["sft"])
        assert plus.keys() == base.keys() and len(plus) == n
        assert r["paired"]["sfa"]["difference"] == pytest.approx(sum(plus[t] - base[t] for t in plus) / n)
        assert r["sft"]["acceptance"] == pytest.approx(sum(x["accepted"] for x in rows["sft"]) / n)
    assert "Schema augmentation" in stdout and (out / "tables.md").read_text().startswith("### DAgger")
    assert json.loads((out / "seed-0" / "dagger.json").read_text())["labels"] == results["seeds"]["0"]["dagger"]["labels"]


def test_distillation_takes_as_many_verified_episodes_from_each_source(run):
    """The teacher's verified episodes are those of its greedy training-task run with reward 1 and an answer;
    the expert's, its claude-code episodes with the same; each student trains on min(teacher, expert) of its
    source's. At the tiny size the teacher solves none, so no student is trained and the table says why."""
    out, results, stdout = run
    d = results["seeds"]["0"]["distill"]

    def verified(path, harness=None):
        return [t for t in read_trajectories(path) if t.reward == 1.0 and t.outcome.get("termination") == "answered"
                and harness in (None, t.meta["harness"]["name"])]

    teacher = verified(out / "seed-0" / "teacher-episodes.jsonl")
    expert = verified(out / "seed-0" / "demo" / "expert.jsonl", "claude-code")
    assert (d["teacher_verified"], d["expert_verified"]) == (len(teacher), len(expert))
    assert d["episodes"] == min(len(teacher), len(expert))
    assert d["shared_tasks"] == len({t.task.id for t in teacher} & {t.task.id for t in expert}) >= d["identical_on_shared"]
    rewards = [t.reward for t in read_trajectories(out / "seed-0" / "demo" / "eval-rl-teacher-claude-code.jsonl")]
    assert d["teacher_rl_reward"] == pytest.approx(sum(rewards) / len(rewards))
    # the expert's claude-code training tasks: half its episodes (4 tiny, 80 quick)
    assert len(read_trajectories(out / "seed-0" / "teacher-episodes.jsonl")) == results["config"]["sft_episodes"] // 2
    if not d["episodes"]:
        assert d["skipped"] == "no verified teacher episode" and "no verified teacher episode" in stdout


def test_acc_trains_one_compiled_record_per_verified_task_and_pairs_qa_by_task(run):
    """One compiled record per training task with a verified episode (2 boxes' observations fit the 256-token
    budget, so none is rejected for it); held-out QA from the careful expert's uncompressed test episodes (all
    verified: one record per evaluation task); the QA difference is the mean of the per-task differences."""
    out, results, stdout = run
    d = results["seeds"]["0"]["acc"]
    solved = {t.task.id for t in read_trajectories(out / "seed-0" / "demo" / "expert.jsonl") if t.reward == 1.0}
    assert d["compiled"] == len(solved) and set(d["rejected"]) <= {"answer not verified right"}
    n = tasks(results)
    assert d["heldout_qa"] == n
    qa = d["qa_per_task"]
    assert qa["sft"].keys() == qa["sft+acc"].keys() and len(qa["sft"]) == n
    assert d["paired"]["qa"]["difference"] == pytest.approx(sum(qa["sft+acc"][t] - qa["sft"][t] for t in qa["sft"]) / n)
    for arm in ("sft", "sft+acc"):
        assert d["acceptance"][arm] == pytest.approx(sum(accepted(out / "seed-0" / f"eval-acc-{arm}.jsonl").values()) / n)
    assert "ACC: compiled QA trained in" in stdout


def test_distillation_students_train_on_each_source_when_the_teacher_solved_tasks(run, tmp_path):
    """The students' path, which the tiny and quick teachers never reach: the section reads a teacher's episodes from
    ``teacher-episodes.jsonl`` when the file is there, so this run is given the expert's own claude-code
    episodes as the teacher's. Then every verified teacher episode equals the expert's (identical on all
    shared tasks), each student trains on k = min(verified) episodes, the student has half the teacher's
    layers, and the paired difference is the mean of the per-task differences of the students' episodes."""
    import shutil

    from memorywalker.records import write_trajectories

    first, results, _ = run
    out = tmp_path / "out"
    shutil.copytree(first / "seed-0" / "demo", out / "seed-0" / "demo")
    shutil.copy(first / "seed-0" / "teacher.json", out / "seed-0" / "teacher.json")
    expert = [t for t in read_trajectories(out / "seed-0" / "demo" / "expert.jsonl") if t.meta["harness"]["name"] == "claude-code"]
    write_trajectories(out / "seed-0" / "teacher-episodes.jsonl", expert)
    res = subprocess.run([sys.executable, str(SCRIPT), "--size", results["size"], "--seeds", "0", "--out", str(out), "--only", "distill"],
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    d = json.loads((out / "seed-0" / "distill.json").read_text())
    solved = [t for t in expert if t.reward == 1.0]
    assert solved, "the expert solves at least one claude-code task (1 of 4 tiny)"
    assert d["episodes"] == d["teacher_verified"] == d["expert_verified"] == len(solved)
    assert d["identical_on_shared"] == d["shared_tasks"] == len(solved)
    layers = results["config"]["num_layers"]  # 2 tiny, 4 quick
    assert (d["student_layers"], d["teacher_layers"]) == (layers // 2, layers)
    config = json.loads((out / "seed-0" / "student-from-teacher" / "final" / "config.json").read_text())
    assert config["num_hidden_layers"] == layers // 2
    rows = {arm: accepted(out / "seed-0" / f"eval-student-{arm}.jsonl")
            for arm in ("from-teacher", "from-expert", "from-expert-unfiltered")}
    for arm, acc in rows.items():
        assert d["acceptance"][arm] == pytest.approx(sum(acc.values()) / len(acc))
    a, b = rows["from-teacher"], rows["from-expert"]
    assert d["paired"]["acceptance"]["difference"] == pytest.approx(sum(a[t] - b[t] for t in a) / len(a))
    assert "student: from teacher / from expert / expert unfiltered" in res.stdout

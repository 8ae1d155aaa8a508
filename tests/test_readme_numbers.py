"""The README's numbers equal a fresh run of the command shown beside them.

The quick demo (under 4 minutes on 2 cores) is rerun here and its table compared, character for
character, with the block the README quotes between ``<!-- demo-table:quick begin/end -->``. The full
demo's block is checked the same way by ``memorywalker demo --check-readme README.md`` (13-15
minutes; docs/README section "What the demo shows"). Reruns are bitwise identical, so any difference
means the README is stale.

    python -m pytest -m slow tests/test_readme_numbers.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memorywalker.metrics.report import readme_table, results_table
from memorywalker.recipes.demo import QUICK, run_demo

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quotes_both_demo_tables():
    text = README.read_text(encoding="utf-8")
    for name in ("full", "quick"):
        table = readme_table(text, name)
        assert table.startswith("Held-out reward under `claude-code`"), name


@pytest.mark.slow  # the quick demo: about 4 minutes on 2 cores
def test_readme_quick_table_equals_a_fresh_run(tmp_path):
    doc = run_demo(QUICK, tmp_path, progress=False, log=lambda s: None)
    assert readme_table(README.read_text(encoding="utf-8"), "quick") == results_table(doc).strip()

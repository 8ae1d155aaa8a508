"""The README's demo tables state what a fresh run of the command beside them shows.

The quick demo (about 4 minutes on 2 cores) is rerun here and compared with the block the README quotes
between ``<!-- demo-table:quick begin/end -->``: the same verdict on every conclusion, every mean
reward within ``READ_TOLERANCE`` (``metrics.report.readme_differences``). The full demo's block is
checked the same way by ``memorywalker demo --check-readme README.md``. Bytes are not compared: a
rerun is bitwise identical only on the same machine with the same thread count.

    python -m pytest -m slow tests/test_readme_numbers.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memorywalker.metrics.report import readme_differences, readme_table
from memorywalker.recipes.demo import QUICK, run_demo

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quotes_both_demo_tables():
    text = README.read_text(encoding="utf-8")
    for name in ("full", "quick"):
        table = readme_table(text, name)
        assert table.startswith("Conclusions, checked on this run:"), name
        assert "Held-out reward under `claude-code`" in table, name


@pytest.mark.slow  # the quick demo: about 4 minutes on 2 cores
def test_readme_quick_table_states_what_a_fresh_run_shows(tmp_path):
    doc = run_demo(QUICK, tmp_path, progress=False, log=lambda s: None)
    assert readme_differences(readme_table(README.read_text(encoding="utf-8"), "quick"), doc) == []

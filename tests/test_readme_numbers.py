"""The README's demo headlines state what a fresh run of the command beside them shows.

The quick demo (about 4 minutes on 2 cores) is rerun here and judged against the headline the README
quotes between ``<!-- demo-seeds:quick begin/end -->`` by the rule ``memorywalker demo --check-readme``
applies to the full demo (``metrics.seeds.check_run``): every conclusion that held on every recorded run
holds, every mean reward within reach of the recorded range. Bytes are not compared: a rerun is bitwise
identical only on the same machine with the same thread count.

    python -m pytest -m slow tests/test_readme_numbers.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memorywalker.metrics.seeds import check_run, readme_block, run_summary
from memorywalker.recipes.demo import QUICK, run_demo

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quotes_both_headlines_and_seed_0s_full_table():
    text = README.read_text(encoding="utf-8")
    for name in ("full", "quick"):
        block = readme_block(text, name)
        assert block.startswith("Conclusions over "), name
        assert "Held-out reward under `claude-code` over " in block, name
    one = text.split("<!-- demo-table:full begin -->", 1)[1].split("<!-- demo-table:full end -->", 1)[0]
    assert one.strip().startswith("Conclusions, checked on this run:")


@pytest.mark.slow  # the quick demo: about 4 minutes on 2 cores
def test_readme_quick_headline_states_what_a_fresh_run_shows(tmp_path):
    doc = run_demo(QUICK, tmp_path, progress=False, log=lambda s: None)
    assert check_run(readme_block(README.read_text(encoding="utf-8"), "quick"), run_summary(doc)) == []

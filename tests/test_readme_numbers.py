"""The demo's headlines state what a fresh run of the command beside them shows.

The README quotes the full demo's headline over seeds (``<!-- demo-seeds:full begin/end -->``);
docs/demo.md quotes the quick demo's (``demo-seeds:quick``) and seed 0's one-run tables
(``demo-table:full``). The quick demo (about 4 minutes on 2 cores) is rerun here and judged against its
headline by the rule ``memorywalker demo --check-readme`` applies to the full demo
(``metrics.seeds.check_run``): every conclusion that held on every recorded run holds, every mean reward
within reach of the recorded range. Bytes are not compared: a rerun is bitwise identical only on the
same machine with the same thread count.

    python -m pytest -m slow tests/test_readme_numbers.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memorywalker.metrics.seeds import check_run, readme_block, run_summary
from memorywalker.recipes.demo import QUICK, run_demo

ROOT = Path(__file__).resolve().parents[1]
README, DEMO = ROOT / "README.md", ROOT / "docs" / "demo.md"


def test_the_headlines_and_seed_0s_full_table_are_quoted_where_the_docs_say():
    for name, doc in (("full", README), ("quick", DEMO)):
        block = readme_block(doc.read_text(encoding="utf-8"), name)
        assert block.startswith("Conclusions over "), name
        assert "Held-out reward under `claude-code` over " in block, name
    text = DEMO.read_text(encoding="utf-8")
    one = text.split("<!-- demo-table:full begin -->", 1)[1].split("<!-- demo-table:full end -->", 1)[0]
    assert one.strip().startswith("Conclusions, checked on this run:")
    assert "demo-seeds:quick" not in README.read_text(encoding="utf-8")  # each block quoted once


@pytest.mark.slow  # the quick demo: about 4 minutes on 2 cores
def test_the_quick_headline_states_what_a_fresh_run_shows(tmp_path):
    doc = run_demo(QUICK, tmp_path, progress=False, log=lambda s: None)
    assert check_run(readme_block(DEMO.read_text(encoding="utf-8"), "quick"), run_summary(doc)) == []

"""The offline web-search world, the seven suites, splits and the reward."""

from __future__ import annotations

import pytest

from memorywalker.rollout import SUITES, WebSearchEnv, World, exact_match, normalize_answer
from memorywalker.rollout.environments.websearch.expert import read_facts
from memorywalker.rollout.environments.websearch.world import LINK_ATTRS


@pytest.fixture(scope="module")
def env():
    return WebSearchEnv(world_seed=0)


def test_world_is_a_function_of_its_seed():
    a, b, c = World.generate(3), World.generate(3), World.generate(4)
    assert {k: p.text for k, p in a.pages.items()} == {k: p.text for k, p in b.pages.items()}
    assert a.pages.keys() != c.pages.keys()


def test_pages_state_their_facts_and_links_resolve(env):
    w = env.world
    for name, e in w.entities.items():
        title, facts = read_facts(w.page(e.page).text)
        assert title == name
        for attr, value in e.attrs.items():
            if attr in LINK_ATTRS:  # "Name [page-id]" and the page exists
                target = w.entities[str(value)]
                assert facts[attr] == f"{target.name} [{target.page}]"
                assert target.page in w.pages
            else:
                assert facts[attr] == str(value)
    distractors = [p for p in w.pages.values() if p.title not in w.entities]
    assert len(distractors) >= 20


def test_search_ranks_entity_pages_by_name(env):
    """BM25 over titles and texts: an entity's own page is in the top 5 for its name in >= 90 % of cases
    (misses are what the expert's fallbacks exist for)."""
    w = env.world
    names = w.companies + w.people + w.cities
    hits = sum(any(p.title == n for p in w.search(n, k=5)) for n in names)
    assert hits / len(names) >= 0.9
    assert w.search("the of and") == []  # stopwords only: no results, no crash


def test_tools_never_raise_on_bad_input(env):
    env.reset(env.task("lookup", 0))
    assert env.step("open", {"page": "no-such-page"}).observation.startswith("Error")
    assert env.step("open", {}).observation.startswith("Error")
    assert env.step("search", {"query": ["list"]}).observation.startswith("Error")
    assert env.step("fly", {"to": "moon"}).observation.startswith("Error: unknown tool")


@pytest.mark.parametrize("suite", list(SUITES))
def test_suites_are_deterministic_and_answerable(env, suite):
    for i in range(20):
        t = env.task(suite, i)
        assert t == env.task(suite, i)
        assert t.answer and t.suite == suite and t.split in ("train", "valid", "test")
        env.reset(t)
        assert env.step("answer", {"text": t.answer}).reward == 1.0
        assert env.step("answer", {"text": t.answer + "x"}).reward == 0.0


def test_splits_are_by_group_and_disjoint(env):
    tasks = [env.task(s, i) for s in SUITES for i in range(150)]
    by_group: dict[str, set] = {}
    for t in tasks:
        by_group.setdefault(t.group, set()).add(t.split)
    assert all(len(s) == 1 for s in by_group.values())  # a question never lands in two splits
    counts = {s: sum(t.split == s for t in tasks) for s in ("train", "valid", "test")}
    assert counts["train"] > 0.7 * len(tasks) and counts["valid"] > 0 and counts["test"] > 0


def test_constraint_tasks_have_a_unique_solution(env):
    w = env.world
    for i in range(30):
        t = env.task("constraint", i)
        c = t.meta["program"]["combine"]
        ok = []
        for name in w.companies:
            a = w.entities[name].attrs
            if a["city"] != c["city"]:
                continue
            good = True
            for attr, cmp, v in c["clues"]:
                x = a[attr]
                good &= (x == v) if cmp == "=" else (int(x) > v) if cmp == ">" else (int(x) < v)
            ok += [name] * good
        assert ok == [t.answer]


def test_normalized_exact_match():
    assert normalize_answer("The  Velka Works.") == "velka works"
    assert exact_match("48,200", "48200") == 1.0
    assert exact_match("Velka", "Velka Works") == 0.0

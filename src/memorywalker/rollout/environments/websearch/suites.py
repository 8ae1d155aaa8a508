"""Seven task suites over a :class:`~memorywalker.rollout.environments.websearch.world.World`, modelled on web-search benchmarks.

=============  ==========================================================  ==========================
suite          question                                                    evidence to gather
=============  ==========================================================  ==========================
lookup         "In what year was Velka Works founded?"                     1 page (search, open)
bridge         "What is the population of the city where X is based?"      2 pages (search, follow link)
chain          "In what year was the hometown of the founder of X founded?" 3 pages
comparison     "Which was founded earlier, X or Y?"                        2 pages (two searches)
aggregation    "What is the total number of employees of X, Y and Z?"      3-4 pages
navigation     "Start at page x. Follow its partner link, then ..."        3-4 pages, no search
constraint     "Which company is based in C, makes lamps and was ...?"     city page + candidates
=============  ==========================================================  ==========================

Each task carries its decomposition as ``task.meta["program"]``: the steps a solver has to take
(``{"entity"|"ref"|"page": ..., "attr": ...}``) and how the answer combines their values. The program
names what to look up, never the values; the scripted expert executes it against the pages it opens.
Tasks are split into train/valid/test by a hash of their group (the question), so the same question
never lands in two splits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from memorywalker.errors import InputError
from memorywalker.records.schema import Task
from memorywalker.rollout.environments.base import split_of
from memorywalker.rollout.environments.websearch.world import CITY, COMPANY, LINK_ATTRS, PERSON, World, slug

ATTRS = {
    CITY: ["founded", "population"],
    COMPANY: ["city", "founder", "partner", "founded", "employees", "product"],
    PERSON: ["hometown", "mentor", "born", "occupation"],
}
ASK = {
    "founded": "In what year was {X} founded?",
    "employees": "How many people does {X} employ?",
    "product": "What does {X} make?",
    "city": "In which city is {X} based?",
    "founder": "Who founded {X}?",
    "partner": "Which company does {X} work with?",
    "born": "In what year was {X} born?",
    "occupation": "What is the occupation of {X}?",
    "hometown": "What is the hometown of {X}?",
    "mentor": "Who was the mentor of {X}?",
    "population": "What is the population of {X}?",
}
PHRASE = {
    "city": "the city where {X} is based",
    "founder": "the founder of {X}",
    "partner": "the partner company of {X}",
    "hometown": "the hometown of {X}",
    "mentor": "the mentor of {X}",
}
KIND_NOUN = {CITY: "city", COMPANY: "company", PERSON: "person"}
ANSWER_HINT = " Answer with the {what} only."


def _walk(world: World, rng: random.Random, start: str, hops: int) -> tuple[list[str], list[str]]:
    """A random path of ``hops`` link attributes from ``start``: (entities visited, attrs followed)."""
    names, attrs = [start], []
    for hop in range(hops):
        e = world.entities[names[-1]]
        # Cities have no outgoing links, so only the last hop may lead to one.
        attr = rng.choice([a for a in ATTRS[e.kind] if a in LINK_ATTRS
                           and (hop == hops - 1 or LINK_ATTRS[a] != CITY)])
        attrs.append(attr)
        names.append(world.link_target(e.name, attr))
    return names, attrs


def _final_attr(world: World, rng: random.Random, name: str, *, links: bool = True) -> str:
    kind = world.entities[name].kind
    return rng.choice([a for a in ATTRS[kind] if links or a not in LINK_ATTRS])


def _hint(attr: str) -> str:
    return ANSWER_HINT.format(what="number" if attr in ("founded", "born", "employees", "population")
                              else "name" if attr in LINK_ATTRS or attr == "name" else "word")


def _multi_hop(world: World, rng: random.Random, hops: int) -> tuple[str, str, dict[str, Any]]:
    start = rng.choice(world.companies + world.people)
    names, attrs = _walk(world, rng, start, hops)
    final = _final_attr(world, rng, names[-1])
    phrase = start
    for a in attrs:
        phrase = PHRASE[a].format(X=phrase)
    question = ASK[final].format(X=phrase) + _hint(final)
    steps = [{"entity": start, "attr": attrs[0]}]
    steps += [{"ref": i, "attr": a} for i, a in enumerate(attrs[1:] + [final])]
    return question, str(world.entities[names[-1]].attrs[final]), {"steps": steps, "combine": {"op": "last"}}


def gen_lookup(world: World, rng: random.Random):
    name = rng.choice(world.companies + world.people + world.cities)
    attr = _final_attr(world, rng, name)
    question = ASK[attr].format(X=name) + _hint(attr)
    program = {"steps": [{"entity": name, "attr": attr}], "combine": {"op": "last"}}
    return question, str(world.entities[name].attrs[attr]), program


def gen_bridge(world: World, rng: random.Random):
    return _multi_hop(world, rng, 1)


def gen_chain(world: World, rng: random.Random):
    return _multi_hop(world, rng, 2)


_COMPARE = {
    COMPANY: [("founded", "Which was founded earlier, {A} or {B}?", "min"),
              ("employees", "Which employs more people, {A} or {B}?", "max")],
    PERSON: [("born", "Who was born earlier, {A} or {B}?", "min")],
    CITY: [("population", "Which city has the larger population, {A} or {B}?", "max"),
           ("founded", "Which city was founded earlier, {A} or {B}?", "min")],
}


def gen_comparison(world: World, rng: random.Random):
    kind = rng.choice([COMPANY, COMPANY, PERSON, CITY])
    pool = {COMPANY: world.companies, PERSON: world.people, CITY: world.cities}[kind]
    attr, template, op = rng.choice(_COMPARE[kind])
    while True:
        a, b = rng.sample(pool, 2)
        va, vb = world.entities[a].attrs[attr], world.entities[b].attrs[attr]
        if va != vb:
            break
    gold = a if (va < vb) == (op == "min") else b
    program = {"steps": [{"entity": a, "attr": attr}, {"entity": b, "attr": attr}],
               "combine": {"op": "arg" + op, "names": [a, b]}}
    return template.format(A=a, B=b) + _hint("name"), gold, program


def gen_aggregation(world: World, rng: random.Random):
    if rng.random() < 0.5:
        names = rng.sample(world.companies, 3)
        total = sum(int(world.entities[n].attrs["employees"]) for n in names)
        question = f"What is the total number of employees of {names[0]}, {names[1]} and {names[2]}?"
        program = {"steps": [{"entity": n, "attr": "employees"} for n in names], "combine": {"op": "sum"}}
        return question + _hint("employees"), str(total), program
    names = rng.sample(world.companies, 4)
    city = world.entities[rng.choice(names)].attrs["city"]
    count = sum(world.entities[n].attrs["city"] == city for n in names)
    question = f"How many of {names[0]}, {names[1]}, {names[2]} and {names[3]} are based in {city}?"
    program = {"steps": [{"entity": n, "attr": "city"} for n in names],
               "combine": {"op": "count", "value": city}}
    return question + ANSWER_HINT.format(what="number"), str(count), program


def gen_navigation(world: World, rng: random.Random):
    start = rng.choice(world.companies + world.people)
    hops = rng.choice([2, 3])
    names, attrs = _walk(world, rng, start, hops)
    final = _final_attr(world, rng, names[-1], links=False)
    follow = ", then ".join(f"the {a} link of that page" if i else f"its {a} link" for i, a in enumerate(attrs))
    noun = KIND_NOUN[world.entities[names[-1]].kind]
    question = (f"Start at page {slug(start)}. Follow {follow}. "
                + ASK[final].format(X=f"the {noun} you reach") + _hint(final))
    steps = [{"page": slug(start), "attr": attrs[0]}]
    steps += [{"ref": i, "attr": a} for i, a in enumerate(attrs[1:] + [final])]
    return question, str(world.entities[names[-1]].attrs[final]), {"steps": steps, "combine": {"op": "last"}}


def gen_constraint(world: World, rng: random.Random):
    for _ in range(1000):
        city = rng.choice(world.cities)
        based = [c for c in world.companies if world.entities[c].attrs["city"] == city]
        if len(based) < 3:
            continue
        target = rng.choice(based)
        t = world.entities[target].attrs
        same = [c for c in based if world.entities[c].attrs["product"] == t["product"] and c != target]
        attr = rng.choice(["founded", "employees"])
        others = [int(world.entities[c].attrs[attr]) for c in same]
        v = int(t[attr])
        if all(o < v for o in others):  # target is the largest: "after" / "more than" a threshold
            lo = max(others, default=v - rng.randint(5, 40))
            threshold, cmp = (lo + v) // 2, ">"
        elif all(o > v for o in others):
            hi = min(others, default=v + rng.randint(5, 40))
            threshold, cmp = (hi + v + 1) // 2, "<"
        else:
            continue
        if threshold == v:
            continue
        clue = {("founded", ">"): f"was founded after {threshold}", ("founded", "<"): f"was founded before {threshold}",
                ("employees", ">"): f"employs more than {threshold} people",
                ("employees", "<"): f"employs fewer than {threshold} people"}[attr, cmp]
        question = f"Which company is based in {city}, makes {t['product']} and {clue}?" + _hint("name")
        program = {"steps": [], "combine": {"op": "constraint", "city": city,
                                            "clues": [["product", "=", t["product"]], [attr, cmp, threshold]]}}
        return question, target, program
    raise RuntimeError("no city with enough companies for a constraint task; generate a larger world")


SUITES: dict[str, Callable[[World, random.Random], tuple[str, str, dict[str, Any]]]] = {
    "lookup": gen_lookup,
    "bridge": gen_bridge,
    "chain": gen_chain,
    "comparison": gen_comparison,
    "aggregation": gen_aggregation,
    "navigation": gen_navigation,
    "constraint": gen_constraint,
}


def make_task(world: World, suite: str, index: int) -> Task:
    """Task number ``index`` of ``suite`` in ``world`` (deterministic in world seed, suite and index)."""
    if suite not in SUITES:
        raise InputError(f"unknown suite {suite!r}; valid: {sorted(SUITES)}")
    rng = random.Random(f"task-{world.seed}-{suite}-{index}")
    question, answer, program = SUITES[suite](world, rng)
    group = f"{suite}:{question}"
    return Task(id=f"{suite}-{index:05d}", group=group, split=split_of(f"{world.seed}:{group}"), suite=suite,
                answer=answer, meta={"question": question, "program": program, "world_seed": world.seed,
                                     "index": index})

"""The offline web-search world: seeded entities with attributes and links, verbose pages, BM25 search.

A :class:`World` is a small encyclopedia generated from one seed. There are three entity types:

* **city** — ``founded`` (year), ``population``;
* **company** — ``city`` (link to a city), ``founder`` (link to a person), ``partner`` (link to a
  company), ``founded``, ``employees``, ``product``;
* **person** — ``hometown`` (link to a city), ``mentor`` (link to a person), ``born``, ``occupation``.

Every entity has one page (id = its slugged name) that opens with a ``Facts:`` box, one fact per line
(``- founded: 1903``; links read ``- city: Orvo [orvo]`` with the page id in brackets), followed by
verbose prose full of distracting names and numbers, and a ``Links:`` line. City pages also list the
companies based there. Distractor pages (``<Name> Museum``, ``<Name> Society``, ...) mention an entity
many times and carry a Facts box of their own, about something else. Search is BM25 (``bm25s``) over
titles and texts and returns page ids, titles and a snippet.

>>> w = World.generate(seed=0)
>>> e = w.entities[w.companies[0]]
>>> w.page(e.page).text.splitlines()[0] == e.name
True
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import cached_property

from memorywalker.rollout.environments.bm25 import bm25_index, bm25_top

CITY, COMPANY, PERSON = "city", "company", "person"
LINK_ATTRS = {"city": CITY, "founder": PERSON, "partner": COMPANY, "hometown": CITY, "mentor": PERSON}

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "k", "m"]
_COMPANY_SUFFIX = ["Works", "Labs", "Mills", "Foods", "Motors", "Press", "Yards", "Optics"]
_PRODUCTS = ["lamps", "boats", "clocks", "paper", "bread", "radios", "shoes", "glass", "bikes", "tea"]
_OCCUPATIONS = ["engineer", "painter", "chemist", "pilot", "teacher", "banker", "architect", "poet"]
_DISTRACTOR_KINDS = ["Museum", "Society", "Festival", "Archive", "Trail"]


def slug(name: str) -> str:
    """Page id of a title: lowercase words joined by hyphens.

    >>> slug("Velka Works Museum")
    'velka-works-museum'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass
class Entity:
    name: str
    kind: str  # CITY | COMPANY | PERSON
    attrs: dict[str, int | str] = field(default_factory=dict)  # link attrs hold the target's name

    @property
    def page(self) -> str:
        return slug(self.name)


@dataclass(frozen=True)
class Page:
    id: str
    title: str
    text: str


class World:
    """Entities, pages and a BM25 index, all determined by ``seed`` and the size parameters."""

    def __init__(self, seed: int, entities: dict[str, Entity], pages: dict[str, Page]):
        self.seed = seed
        self.entities = entities
        self.pages = pages
        self.cities = [n for n, e in entities.items() if e.kind == CITY]
        self.companies = [n for n, e in entities.items() if e.kind == COMPANY]
        self.people = [n for n, e in entities.items() if e.kind == PERSON]

    # --- generation -------------------------------------------------------------------------------

    @classmethod
    def generate(cls, seed: int = 0, *, n_cities: int = 10, n_companies: int = 28, n_people: int = 28,
                 n_distractors: int = 30) -> World:
        rng = random.Random(f"world-{seed}")
        used: set[str] = set()

        def word() -> str:
            while True:
                w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.choice([1, 2])))
                w = (w + rng.choice(_CODAS)).capitalize()
                if 3 <= len(w) <= 7 and w not in used:
                    used.add(w)
                    return w

        entities: dict[str, Entity] = {}
        cities = [word() for _ in range(n_cities)]
        for c in cities:
            entities[c] = Entity(c, CITY, {"founded": rng.randint(1100, 1890),
                                           "population": rng.randint(40, 990) * 100})
        people = [f"{word()} {word()}" for _ in range(n_people)]
        for i, p in enumerate(people):
            entities[p] = Entity(p, PERSON, {"hometown": rng.choice(cities),
                                             "mentor": people[(i + rng.randint(1, n_people - 1)) % n_people],
                                             "born": rng.randint(1820, 1995),
                                             "occupation": rng.choice(_OCCUPATIONS)})
        companies = [f"{word()} {rng.choice(_COMPANY_SUFFIX)}" for _ in range(n_companies)]
        for i, c in enumerate(companies):
            entities[c] = Entity(c, COMPANY, {"city": rng.choice(cities), "founder": rng.choice(people),
                                              "partner": companies[(i + rng.randint(1, n_companies - 1)) % n_companies],
                                              "founded": rng.randint(1850, 2015),
                                              "employees": rng.randint(12, 4800),
                                              "product": rng.choice(_PRODUCTS)})
        pages: dict[str, Page] = {}
        names = list(entities)
        for name, e in entities.items():
            pages[e.page] = Page(e.page, name, _entity_page(e, entities, names, rng))
        for _ in range(n_distractors):
            about = rng.choice(names)
            title = f"{about} {rng.choice(_DISTRACTOR_KINDS)}"
            if slug(title) in pages:
                continue
            pages[slug(title)] = Page(slug(title), title, _distractor_page(title, about, entities, names, rng))
        return cls(seed, entities, pages)

    # --- access -----------------------------------------------------------------------------------

    def page(self, page_id: str) -> Page:
        return self.pages[page_id]

    def link_target(self, name: str, attr: str) -> str:
        return str(self.entities[name].attrs[attr])

    @cached_property
    def _index(self):
        self._page_ids = list(self.pages)
        return bm25_index([f"{p.title}\n{p.title}\n{p.text}" for p in self.pages.values()])

    def search(self, query: str, k: int = 5) -> list[Page]:
        """The top-``k`` pages for ``query`` by BM25 score (ties broken by page order)."""
        return [self.pages[self._page_ids[i]] for i, _ in bm25_top(self._index, query, k, len(self._page_ids))]


# --- page text ----------------------------------------------------------------------------------------

def fact_lines(e: Entity, entities: dict[str, Entity]) -> list[str]:
    lines = []
    for attr, value in e.attrs.items():
        if attr in LINK_ATTRS:
            lines.append(f"- {attr}: {value} [{entities[str(value)].page}]")
        else:
            lines.append(f"- {attr}: {value}")
    if e.kind == CITY:  # the companies based in a city, as links (constraint search starts here)
        based = [c for c in entities.values() if c.kind == COMPANY and c.attrs["city"] == e.name]
        lines.append("- companies: " + (", ".join(f"{c.name} [{c.page}]" for c in based) or "none"))
    return lines


_FILLER = [
    "Local historians often mention the {other} fair of {year}, which drew {n} visitors.",
    "A survey in {year} counted {n} households in the district around {other}.",
    "Older records spell the name differently, and some maps from {year} confuse it with {other}.",
    "Visitors describe long streets, a quiet harbour and a market that opens at {hour} every morning.",
    "The archive keeps {n} letters, most of them written to {other} between {year} and {year2}.",
    "In {year} a storm damaged the old hall; repairs were paid for by {other}.",
    "A travel guide from {year} calls it one of the better stops on the road to {other}.",
    "Critics have compared its history to that of {other}, although the two have little in common.",
]


def _filler(rng: random.Random, names: list[str], n_sentences: int) -> str:
    out = []
    for template in rng.sample(_FILLER, n_sentences):
        year = rng.randint(1700, 2020)
        out.append(template.format(other=rng.choice(names), year=year, year2=year + rng.randint(1, 40),
                                              n=rng.randint(30, 9000), hour=rng.randint(5, 9)))
    return " ".join(out)


def _entity_page(e: Entity, entities: dict[str, Entity], names: list[str], rng: random.Random) -> str:
    a = e.attrs
    if e.kind == CITY:
        lead = f"{e.name} is a city founded in {a['founded']}. It has about {a['population']} inhabitants."
        links = [c.page for c in entities.values() if c.kind == COMPANY and c.attrs["city"] == e.name]
    elif e.kind == COMPANY:
        lead = (f"{e.name} is a maker of {a['product']} based in {a['city']}, founded in {a['founded']} "
                f"by {a['founder']}. It employs {a['employees']} people and works with {a['partner']}.")
        links = [entities[str(a[k])].page for k in ("city", "founder", "partner")]
    else:
        lead = (f"{e.name} is a {a['occupation']} born in {a['born']} in {a['hometown']}, "
                f"a student of {a['mentor']}.")
        links = [entities[str(a[k])].page for k in ("hometown", "mentor")]
    parts = [e.name, "Facts:", *fact_lines(e, entities), "", lead, _filler(rng, names, 4),
             _filler(rng, names, 3), "Links: " + ", ".join(links)]
    return "\n".join(parts)


def _distractor_page(title: str, about: str, entities: dict[str, Entity], names: list[str],
                     rng: random.Random) -> str:
    e = entities[about]
    facts = ["- founded: " + str(rng.randint(1900, 2020)), "- members: " + str(rng.randint(10, 900))]
    lead = (f"The {title} is named after {about}. It is not the same as {about} itself, "
            f"but visitors to {about} often stop by.")
    return "\n".join([title, "Facts:", *facts, "", lead, _filler(rng, names, 4),
                      f"See also: {about} [{e.page}]", "Links: " + e.page])

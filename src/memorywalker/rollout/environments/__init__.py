"""The environments a rollout runs against, each in its own folder with its scripted expert beside it.

* :mod:`.base` — the :class:`~.base.Environment` interface, :class:`~.base.StepResult`, the answer
  normalization and exact-match reward every suite uses, the stable train/valid/test split;
* :mod:`.websearch` — search / open / answer over a seeded offline encyclopedia (world, suites, expert);
* :mod:`.vault` — recall tasks a tiny model trained on a CPU learns (env, expert);
* :mod:`.corpus` — search / open / answer over a fixed local document corpus, BrowseComp-Plus style
  (documents and grading, env, expert);
* :mod:`.bm25` — the BM25 ranking ``websearch`` and ``corpus`` search with; :mod:`.experts` — what the
  scripted experts share (tc-rag frames, how a response is written).

:data:`ENVIRONMENTS` finds one by name (``memorywalker rollout --env NAME``).
"""

from memorywalker.rollout.environments.base import Environment
from memorywalker.rollout.environments.corpus.env import CorpusEnv
from memorywalker.rollout.environments.vault.env import VaultEnv
from memorywalker.rollout.environments.websearch.env import WebSearchEnv

ENVIRONMENTS: dict[str, type[Environment]] = {"websearch": WebSearchEnv, "vault": VaultEnv, "corpus": CorpusEnv}

__all__ = ["ENVIRONMENTS"]

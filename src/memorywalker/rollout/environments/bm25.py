"""BM25 ranking, as the search tools of ``websearch`` and ``corpus`` use it (``bm25s``, Lucene scoring,
English stopwords)."""

from __future__ import annotations


def bm25_index(texts: list[str], *, progress: bool = False):
    """A ``bm25s`` retriever over ``texts`` (English stopwords; ``progress``: bm25s's progress bars)."""
    import bm25s  # lazy: bm25s (~150 ms) off the CLI's start path

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=progress), show_progress=progress)
    return retriever


def bm25_top(retriever, query: str, k: int, n: int) -> list[tuple[int, float]]:
    """The ``k`` best of ``n`` indexed documents for ``query``: (index, BM25 score), best first, ties broken
    by index; documents sharing no term with the query (score 0) are left out. English stopwords, as
    the indexes here are built."""
    import bm25s  # lazy: bm25s (~150 ms) off the CLI's start path

    tokens = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
    if not tokens[0]:
        return []
    idx, scores = retriever.retrieve(tokens, k=min(k, n), show_progress=False, n_threads=1)
    ranked = sorted(zip(idx[0].tolist(), scores[0].tolist(), strict=True), key=lambda d: (-d[1], d[0]))
    return [(i, s) for i, s in ranked if s > 0]

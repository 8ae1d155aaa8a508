"""``corpus``: search / open / answer over a fixed local document corpus (BrowseComp-Plus style) —
:mod:`.documents` (the files, the BM25 index, the grading), :mod:`.env` (the tools, and the grade of a
recorded episode) and :mod:`.expert` (an oracle that opens the gold evidence)."""

"""``websearch``: the offline web-search environment — :mod:`.world` (a seeded encyclopedia with BM25
search), :mod:`.suites` (seven task suites over it), :mod:`.env` (the tools: search / open / answer) and
:mod:`.expert` (the scripted expert that executes a task's program, keeping notes)."""

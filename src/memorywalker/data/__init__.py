"""Package resources: the bundled corpus (``corpus.txt``) and example records (``examples/``)."""

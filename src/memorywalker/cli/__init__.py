"""The ``memorywalker`` command: ``main.py`` builds the Typer app from one ``*_cmd.py`` module per command
(each registers itself and imports its heavy machinery only when it runs), ``errors.py`` gives every
command one error style (one line naming the input and the cause; a traceback only under ``--debug``),
and ``renamed.py`` keeps old option spellings working (``--harness`` → ``--compressor``, ``--policy`` →
``--sampler``)."""

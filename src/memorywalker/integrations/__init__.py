"""memorywalker's exact engine inside other trainers: TRL (:mod:`memorywalker.integrations.trl`). See
docs/integrations.md for TRL and for plugging :func:`memorywalker.engine.logprobs` into a verl policy loss."""

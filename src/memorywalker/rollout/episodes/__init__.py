"""The episode loop and what runs it: :mod:`.harness` (the simulated harness: :class:`~.harness.HarnessConfig`,
one episode's conversation, compression and recording — ``run_episode``), :mod:`.lockstep` (many
episodes with batched sampling), :mod:`.runner` (tasks planned, episodes run and written, resumable),
:mod:`.faults` (seeded tool failures, an environment wrapper) and :mod:`.backends` (the samplers by name,
``make_policy``)."""

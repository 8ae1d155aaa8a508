"""``vault``: recall tasks where compression decides the reward — :mod:`.env` (boxes, codes, the graded
reward) and :mod:`.expert` (the scripted expert, a pure function of the delivered context)."""

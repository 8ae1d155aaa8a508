"""Data transforms: records in, derived records out (lineage kept). Schema augmentation
(:mod:`~memorywalker.transforms.augment`), distillation (:mod:`~memorywalker.transforms.distill`), Agent
Context Compilation (:mod:`~memorywalker.transforms.acc`) and DAgger's labels
(:mod:`~memorywalker.transforms.dagger`; the training loop is :mod:`memorywalker.recipes.dagger`)."""

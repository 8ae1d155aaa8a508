"""Metrics: the train/rollout gap of each method, by evictions, and logit drift."""

"""Federated learning with sub-models: strategies, scheduling, executors, server loop."""

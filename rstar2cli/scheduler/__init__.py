"""Rollout scheduling: the KV ledger (kv.py), the scheduler state machine (scheduler.py), the async
driver (rollout.py) and the inference engines behind one Protocol (engines.py)."""

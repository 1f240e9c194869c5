"""The multi-turn agent loop (`loop.py`): one trajectory from prompt to record, tools included."""

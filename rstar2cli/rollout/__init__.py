"""The rollout path every command shares: the async driver (scheduler + engines + agent + tools),
the command job (items, seeds, the graded sink) and the resume stamps."""

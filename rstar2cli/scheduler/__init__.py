"""The KV-cache-aware rollout scheduler, pure and stdlib-only: the KV ledger (kv.py), admission
(admission.py), length prediction (predict.py), the tail rule (tail.py), the placement policies
(incremental.py, baselines.py) and the state machine that uses them (scheduler.py). It imports no
other rstar2cli package; the driver that runs it against engines is rstar2cli/rollout/driver.py."""

"""The parts of benchmarks/peer_trl.py (rl-stage against TRL's GRPOTrainer on the same model).

settings.py maps one set of knobs onto both sides (rl-stage `--set` overrides, GRPOConfig
arguments); trl_agent.py makes TRL speak the project's chat/tool protocol and grade with the
project's grader; trl_side.py runs GRPOTrainer (its own process); report.py measures a process
tree and turns both sides' step rows into the JSON and the table. Only trl_side.py needs the
`peer` extra (trl).
Tested in tests/unit/test_peer_trl.py.
"""

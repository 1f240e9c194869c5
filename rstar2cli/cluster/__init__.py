"""Cluster plumbing shared by rollout and training: placement of engines and trainer ranks on GPUs
and Ray nodes, the one-GPU fit check, and the trainer -> engines weight sync."""

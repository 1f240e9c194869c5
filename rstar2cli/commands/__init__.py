"""One module per command; each holds one thin function: parse -> load recipe -> compose cores -> report."""

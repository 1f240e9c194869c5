"""Cold-start SFT (`rstar2 sft-coldstart`): non-reasoning SFT on tool-call format and chat.

Modules: `recipe` (schema), `convert` (public chat/function-calling schemas -> `Chat`),
`synthetic_transcripts` (tool-use transcripts for the tiny default), `data` (rendering with the
protocol core -> token ids + assistant-only loss mask, rejects), `packing` (rows with per-example
position ids, token-summed loss), `train` (DeepSpeed loop, checkpoints, exact resume, HF folder),
`progress` (bar, metrics.jsonl, TensorBoard).
"""

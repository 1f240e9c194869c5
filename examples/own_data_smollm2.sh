#!/usr/bin/env bash
# Your own problems, end to end on SmolLM2-135M-Instruct, on a CPU.
#
# The problems are a jsonl in a schema of its own (examples/data/word_problems.jsonl):
#   {"text": "A shop sells pencils at 54 dollars each. ...", "target": {"value": "\\boxed{378}"}}
# prepare-data maps it to the project's schema with --question-field and --answer-field (a
# dotted path reaches inside an object; \boxed{} and '#### n' answers are extracted).
# The steps:
#   0. check-model: the model's chat template and context suit the protocol;
#   1. prepare-data: the held-out set, then the training set decontaminated against it;
#   2. sft-coldstart: teaches the tool-call format on the repository's synthetic transcripts
#      (your problems have no tool-use transcripts; the paper's SFT has no math either);
#   3. rl-stage: GRPO-RoC on your problems;
#   4. eval: the RL model on your held-out problems.
#
# Run from anywhere, after `make smollm2` has built models/smollm2-135m-instruct:
#   bash examples/own_data_smollm2.sh
# Settings (environment variables): MODEL [models/smollm2-135m-instruct], DATA and TEST (the two
# jsonl files), OUT [runs/own-data], SFT_STEPS [10], RL_STEPS [2]. With your own files, change
# --question-field and --answer-field below to your field names. Rerun to resume: each finished
# step is skipped, and sft-coldstart and rl-stage resume from their last checkpoint.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
MODEL="${MODEL:-models/smollm2-135m-instruct}"
DATA="${DATA:-examples/data/word_problems.jsonl}"
TEST="${TEST:-examples/data/word_problems.test.jsonl}"
OUT="${OUT:-runs/own-data}"
SFT_STEPS="${SFT_STEPS:-10}"
RL_STEPS="${RL_STEPS:-2}"

# 0. The model folder: config, tokenizer, chat template, stop token and context.
rstar2 check-model "$MODEL" --recipe recipes/pretrained/rl.yaml

# 1. Your problems in the project's schema (id, question, answer, source, meta).
if [[ ! -f "$OUT/data/test.parquet" ]]; then
  rstar2 prepare-data --source "$TEST" --question-field text --answer-field target.value \
    --integer-only --out "$OUT/data/test.parquet"
fi
if [[ ! -f "$OUT/data/train.parquet" ]]; then
  rstar2 prepare-data --source "$DATA" --question-field text --answer-field target.value \
    --integer-only --decontaminate "$OUT/data/test.parquet" --out "$OUT/data/train.parquet"
fi

# 2. Cold-start SFT on the synthetic tool-use transcripts (data/arith.parquet, in the repository).
rstar2 sft-coldstart --recipe recipes/pretrained/sft.yaml --set model="$MODEL" \
  --set train.max_steps="$SFT_STEPS" --out "$OUT/sft"

# 3. GRPO-RoC on your problems (the in-stage eval is off; step 4 evaluates).
rstar2 rl-stage --recipe recipes/pretrained/rl.yaml --init-from "$OUT/sft/final" \
  --set data.train="$OUT/data/train.parquet" --set data.eval=null \
  --set train.num_steps="$RL_STEPS" --out "$OUT/rl"

# 4. The RL model on the held-out problems: avg@2 at temperature 0.6.
rstar2 eval --model "$OUT/rl/final" --data "$OUT/data/test.parquet" --samples 2 \
  --temperature 0.6 --max-turns 3 --max-response-tokens 384 --out "$OUT/eval" --label rl
echo "done: the summary is $OUT/eval/summary.json" >&2

#!/usr/bin/env bash
# The rStar2-Agent pipeline, chained as the paper runs it (arXiv 2508.20722, sections 4-5):
#   RL data (integer answers, decontaminated) -> non-reasoning SFT -> RL stage 1 (8K responses)
#   -> stage 2 (12K) -> filter-hard (8 samples per problem with the stage-2 model, drop the ones
#   solved 8/8) -> stage 3 (12K, the hard problems, a fresh optimizer) -> evaluation (avg@16).
#
# Run it from anywhere on the Ray head node, with the sandbox daemons already up on the CPU nodes,
# every one started with the same token file (mode 600, copied to each node):
#   (umask 077; python -c "import secrets; print(secrets.token_urlsafe(32))" > sandbox.token)
#   rstar2 serve-sandbox --host 0.0.0.0 --port 8080 --token-file sandbox.token
# then, on the head node, e.g.:
#   RL_SOURCE=my-org/math-rl-42k \
#   SANDBOX="--sandbox http://cpu1:8080 --sandbox http://cpu2:8080" \
#   SANDBOX_TOKEN_FILE=sandbox.token \
#   RAY="--ray-address HEAD:6379" \
#   bash recipes/paper_pipeline.sh
# examples/slurm_paper_pipeline.sbatch does all of this under Slurm.
# Each step is one `rstar2` command and the recipes hold the paper's values. Rerun the script
# after a failure or an interrupt: finished steps are skipped and the interrupted one resumes.
#
# Settings (environment variables):
#   RL_SOURCE   the RL problems: a Hugging Face dataset id or a local file          [required]
#   WORK        the folder data/ and runs/ are written under (the recipes' paths)    [.]
#   EVAL_SETS   benchmarks (names, or local files) to decontaminate against and evaluate on
#                                                                    [aime24 aime25 math500]
#   SANDBOX     --sandbox URL options (empty: an in-process sandbox)                 []
#   SANDBOX_TOKEN_FILE
#               the token file the daemons were started with (without it the commands
#               read $RSTAR2_SANDBOX_TOKEN)                                           []
#   RAY         --ray-address option for the RL stages, filter-hard and eval        []
#   SFT_LAUNCH  how the SFT ranks start: torchrun on every node, e.g. for 8 nodes of 8 GPUs
#               "torchrun --nnodes 8 --nproc_per_node 8 --rdzv-backend c10d
#                --rdzv-endpoint HEAD:29500 --no-python"
#                                            [torchrun --nproc_per_node 8 --no-python]
#   SFT_ARGS, RL_ARGS, FILTER_ARGS, EVAL_ARGS
#               extra options per step, for runs smaller than the paper's (the CI runs this script
#               on a CPU with a tiny model, 2 steps per stage, this way: tests/integration/
#               test_paper_pipeline.py)                                               []
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RECIPES="$REPO/recipes"
: "${RL_SOURCE:?set RL_SOURCE to the RL problems (a Hugging Face dataset id or a local file)}"
WORK="${WORK:-.}"
EVAL_SETS="${EVAL_SETS:-aime24 aime25 math500}"
SANDBOX="${SANDBOX:-}"
SANDBOX_TOKEN_FILE="${SANDBOX_TOKEN_FILE:-}"
RAY="${RAY:-}"
SFT_LAUNCH="${SFT_LAUNCH:-torchrun --nproc_per_node 8 --no-python}"
SFT_ARGS="${SFT_ARGS:-}"
RL_ARGS="${RL_ARGS:-}"
FILTER_ARGS="${FILTER_ARGS:-}"
EVAL_ARGS="${EVAL_ARGS:-}"
# The daemons want their token from every command that sends them tool calls (a word list, as
# SANDBOX is: the path holds no spaces).
if [[ -n "$SANDBOX" && -n "$SANDBOX_TOKEN_FILE" ]]; then
  [[ "$SANDBOX_TOKEN_FILE" == /* ]] || SANDBOX_TOKEN_FILE="$PWD/$SANDBOX_TOKEN_FILE"
  SANDBOX="$SANDBOX --sandbox-token-file $SANDBOX_TOKEN_FILE"
fi
mkdir -p "$WORK"
cd "$WORK"

step() { printf '\n== %s\n' "$*" >&2; }

# 1. RL problems: integer answers only, no 8-gram overlap with the eval sets (paper section 5).
decontaminate=()
for set in $EVAL_SETS; do decontaminate+=(--decontaminate "$set"); done
if [[ ! -f data/rl_math.parquet ]]; then
  step "prepare-data: $RL_SOURCE -> data/rl_math.parquet"
  rstar2 prepare-data --source "$RL_SOURCE" --integer-only "${decontaminate[@]}" \
    --out data/rl_math.parquet
fi

# 2. Non-reasoning cold-start SFT (section 4.1), one rank per GPU.
step "sft-coldstart -> runs/sft"
# shellcheck disable=SC2086  # SFT_LAUNCH and *_ARGS are word lists on purpose
$SFT_LAUNCH rstar2 sft-coldstart --recipe "$RECIPES/sft_coldstart.yaml" --out runs/sft $SFT_ARGS

# 3-4. RL stages 1 and 2 (section 5): 8K then 12K responses, the optimizer carried over.
step "rl-stage 1 -> runs/stage1"
# shellcheck disable=SC2086
rstar2 rl-stage --recipe "$RECIPES/stage1_8k.yaml" --init-from runs/sft/final --out runs/stage1 \
  $SANDBOX $RAY $RL_ARGS
step "rl-stage 2 -> runs/stage2"
# shellcheck disable=SC2086
rstar2 rl-stage --recipe "$RECIPES/stage2_12k.yaml" --init-from runs/stage1 --out runs/stage2 \
  $SANDBOX $RAY $RL_ARGS

# 5. The hard problems: 8 samples each with the stage-2 model, drop those solved 8/8.
if [[ ! -f data/rl_math_hard.parquet ]]; then
  step "filter-hard -> data/rl_math_hard.parquet"
  # shellcheck disable=SC2086
  rstar2 filter-hard --model runs/stage2/final --data data/rl_math.parquet \
    --out data/rl_math_hard.parquet $SANDBOX $RAY $FILTER_ARGS
fi

# 6. RL stage 3 on the hard problems, with a fresh optimizer.
step "rl-stage 3 -> runs/stage3"
# shellcheck disable=SC2086
rstar2 rl-stage --recipe "$RECIPES/stage3_12k_hard.yaml" --init-from runs/stage2 \
  --reset-optimizer --out runs/stage3 $SANDBOX $RAY $RL_ARGS

# 7. Evaluation, the paper's protocol (avg@16 at temperature 0.6, 30 turns, 30K tokens).
benchmarks=()
for set in $EVAL_SETS; do
  if [[ -f "$set" ]]; then benchmarks+=(--data "$set"); else benchmarks+=(--benchmark "$set"); fi
done
step "eval -> evals/"
# shellcheck disable=SC2086
rstar2 eval --model runs/stage3/final "${benchmarks[@]}" --out evals --label stage3 \
  $SANDBOX $RAY $EVAL_ARGS

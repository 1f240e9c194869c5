#!/usr/bin/env bash
# RL stage 1 of the paper (recipes/stage1_8k.yaml) on one node of 8 AMD MI300X GPUs.
#
# vLLM's ROCm builds bundle their own ROCm torch, so this runs inside AMD's rocm/vllm container
# image (vLLM 0.32; ROCm 6.3 or newer with the amdgpu driver on the host). Start the container
# with the GPUs and the repository in it, e.g.:
#   docker run --rm -it --device=/dev/kfd --device=/dev/dri --group-add video --ipc=host \
#     --security-opt seccomp=unconfined -v "$PWD":/workspace -w /workspace \
#     "$IMAGE" bash examples/mi300x_stage1.sh
# IMAGE is the rocm/vllm tag of vLLM 0.32. Inside, the project installs without the `gpu` extra
# (that extra pins the CUDA build), keeping the image's torch and vLLM.
#
# The node splits its GPUs: 4 engines of one GPU each and 4 trainer ranks (the paper ran 64
# GPUs; the batch is the same, so a step takes longer). A sandbox daemon serves the tool calls on
# this node, on loopback, with a token. Settings: INIT_FROM [runs/sft/final, the SFT model],
# OUT [runs/stage1], NUM_ENGINES [4], NUM_TRAINER_RANKS [4], SANDBOX_WORKERS [32].
# What has run on a GPU so far is listed in docs/cluster.md; a whole RL stage on ROCm has not.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
INIT_FROM="${INIT_FROM:-runs/sft/final}"
OUT="${OUT:-runs/stage1}"
NUM_ENGINES="${NUM_ENGINES:-4}"
NUM_TRAINER_RANKS="${NUM_TRAINER_RANKS:-4}"
SANDBOX_WORKERS="${SANDBOX_WORKERS:-32}"

python -c "import torch, vllm; assert torch.version.hip, 'not a ROCm torch'; print('torch', \
torch.__version__, 'HIP', torch.version.hip, 'vLLM', vllm.__version__)"
python -c "import rstar2cli" 2>/dev/null || pip install -e .
# The engines keep HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES in step; name all 8 GPUs.
export HIP_VISIBLE_DEVICES="${HIP_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}"

trap 'kill $(jobs -p) 2>/dev/null || true; ray stop > /dev/null 2>&1 || true' EXIT
TOKEN_FILE="$REPO/sandbox.token"
if [[ ! -f "$TOKEN_FILE" ]]; then
  (umask 077; python -c "import secrets; print(secrets.token_urlsafe(32))" > "$TOKEN_FILE")
fi
rstar2 serve-sandbox --host 127.0.0.1 --port 8080 --workers "$SANDBOX_WORKERS" \
  --token-file "$TOKEN_FILE" &
until curl -fsS http://127.0.0.1:8080/healthz > /dev/null 2>&1; do sleep 2; done

ray start --head --port 6379 --num-gpus 8
rstar2 rl-stage --recipe recipes/stage1_8k.yaml --init-from "$INIT_FROM" --out "$OUT" \
  --set rollout.num_engines="$NUM_ENGINES" --set train.num_trainer_ranks="$NUM_TRAINER_RANKS" \
  --sandbox http://127.0.0.1:8080 --sandbox-token-file "$TOKEN_FILE" \
  --ray-address 127.0.0.1:6379

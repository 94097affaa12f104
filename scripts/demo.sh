#!/usr/bin/env bash
# The main job, end to end: the seed's story in C++, on the same on-disk format as PyTorch
# Lightning.
#   1. train the demo Transformer LM with FSDP on 4 ranks, state_dict_type="sharded",
#      max_steps 3 -> a sharded checkpoint (DCP folder + meta.pt);
#   2. resume it on 2 ranks (elastic: a different world size) to step 5;
#   3. `shardpoint consolidate` the step-5 checkpoint into one torch.save file with a fixed
#      memory budget;
#   4. load the single file with Debian's PyTorch and print its keys, the loss curve,
#      checkpoint sizes and save/load times;
#   5. the same in Python (examples/lightning_fsdp_cpu.py): the real Lightning Trainer with
#      shardpoint.lightning.FSDPStrategy on CPU, 4 processes, resumed on 2, consolidated.
# DEMO_MODEL_SIZE=tiny|demo (default demo: Lightning's LightningTransformer dimensions).
set -euo pipefail
BUILD=${1:-build}
SP="$BUILD/src/cli/shardpoint"
TRAIN="$BUILD/src/train/shardpoint-train"
SIZE=${DEMO_MODEL_SIZE:-demo}
WORK=$(mktemp -d /tmp/shardpoint-demo-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/run"

echo "== 1. train on 4 ranks, sharded checkpoint at step 3 ($SIZE model)"
"$TRAIN" --devices 4 --strategy fsdp --state-dict-type sharded --max-steps 3 --root "$ROOT" \
  --model-size "$SIZE" 2>&1 | tee "$WORK/train1.log"
CKPT3="$ROOT/lightning_logs/version_0/checkpoints/epoch=0-step=3.ckpt"
echo
ls -la "$CKPT3"

echo
echo "== 2. resume on 2 ranks to step 5"
"$TRAIN" --devices 2 --strategy fsdp --state-dict-type sharded --max-steps 5 --root "$ROOT" \
  --model-size "$SIZE" --ckpt-path "$CKPT3" 2>&1 | tee "$WORK/train2.log"
CKPT5="$ROOT/lightning_logs/version_1/checkpoints/epoch=0-step=5.ckpt"

echo
echo "== 3. shardpoint consolidate (streaming, --memory-budget-bytes 64MiB)"
start=$(date +%s.%N)
"$SP" consolidate "$CKPT5" --output_file "$WORK/model.ckpt" --memory-budget-bytes 64MiB --quiet
end=$(date +%s.%N)
"$SP" verify "$CKPT5" >/dev/null && echo "verify: the sharded checkpoint is clean"
"$SP" inspect "$WORK/model.ckpt" | head -12
echo "  ..."

echo
echo "== 4. PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') loads the consolidated file"
/usr/bin/python3 - "$WORK/model.ckpt" "$WORK/train1.log" "$WORK/train2.log" "$CKPT3" "$CKPT5" "$start" "$end" <<'PY'
import os, re, sys, torch
path, log1, log2, ck3, ck5, t0, t1 = sys.argv[1:]
sd = torch.load(path, weights_only=False)  # 1.13's weights-only unpickler has no float opcode
print("top-level keys:", list(sd))
params = sd["state_dict"]
print(f"state_dict: {len(params)} tensors, {sum(t.numel() for t in params.values()):,} parameters, "
      f"e.g. model.embedding.weight {tuple(params['model.embedding.weight'].shape)}")
print(f"epoch={sd['epoch']} global_step={sd['global_step']}")
def losses(log):
    return [(int(m.group(1)), float(m.group(2))) for m in re.finditer(r"step\s+(\d+)/\d+\s+(?:epoch\s+\d+\s+)?loss\s+([0-9.]+)", open(log).read())]
curve = losses(log1) + losses(log2)
print("loss curve:", ", ".join(f"step {s}: {l:.4f}" for s, l in curve))
def size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
print(f"checkpoint sizes: step 3 {size(ck3)/1e6:.1f} MB (sharded, {len(os.listdir(ck3))} files), "
      f"step 5 {size(ck5)/1e6:.1f} MB, consolidated {os.path.getsize(path)/1e6:.1f} MB")
times = re.findall(r"^((?:saved|loaded) \w+ checkpoint[^\n]*)", open(log1).read() + open(log2).read(), re.M)
for t in times:
    print("  " + t.strip())
print(f"  consolidate: {float(t1) - float(t0):.2f} s")
PY
echo
echo "== 5. the same workflow in Python: Lightning's Trainer with shardpoint.lightning.FSDPStrategy"
# The project's venv (CPython 3.11, newest PyTorch, Lightning) with the package from the wheel
# (build-wheel/site, scripts/test-python.sh makes it) or, failing that, python/ over the
# libshardpoint.so of this build.
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
PY=$("$REPO/scripts/setup-python.sh" 2>/dev/null || true)
if [[ -z "$PY" ]]; then
  echo "skipped: no Python venv (scripts/setup-python.sh)"
elif [[ -f "$REPO/build-wheel/site/shardpoint/_lib/libshardpoint.so" ]]; then
  PYTHONPATH="$REPO/build-wheel/site" "$PY" "$REPO/examples/lightning_fsdp_cpu.py" --workdir "$WORK/py"
elif [[ -f "$BUILD/src/capi/libshardpoint.so" ]]; then
  PYTHONPATH="$REPO/python" SHARDPOINT_LIBRARY="$(cd "$BUILD" && pwd -P)/src/capi/libshardpoint.so" \
    "$PY" "$REPO/examples/lightning_fsdp_cpu.py" --workdir "$WORK/py"
else
  echo "skipped: no libshardpoint.so (scripts/test-python.sh builds the wheel)"
fi

echo
echo "demo: OK"

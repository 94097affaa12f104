#!/usr/bin/env bash
# The main job, end to end (grows with each issue). Today:
#   1. write a training state as one torch.save file with shardpoint's C++ API (no Python);
#   2. inspect it with `shardpoint inspect` (human listing, then JSON with hashes);
#   3. load it with Debian's PyTorch 1.13 and check every tensor's SHA-256 against
#      shardpoint's.
set -euo pipefail
BUILD=${1:-build}
SP="$BUILD/src/cli/shardpoint"
WORK=$(mktemp -d /tmp/shardpoint-demo-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

echo "== 1. shardpoint writes a torch.save file (C++ only)"
"$BUILD/examples/save_torch_file" "$WORK/state.pt"

echo
echo "== 2. shardpoint inspect"
"$SP" inspect "$WORK/state.pt"
"$SP" inspect "$WORK/state.pt" --json --hash > "$WORK/inspect.json"

echo
echo "== 3. PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') loads it"
/usr/bin/python3 - "$WORK/state.pt" "$WORK/inspect.json" <<'PY'
import hashlib, json, sys, torch
path, listing = sys.argv[1], json.load(open(sys.argv[2]))
# PyTorch 1.13's weights-only unpickler has no float opcode (BINFLOAT), so a file with float
# hyper-parameters needs weights_only=False there; PyTorch >= 2.x loads it weights-only.
sd = torch.load(path, weights_only=False)
def flat(o, key=""):
    if isinstance(o, torch.Tensor):
        yield key, o
    elif isinstance(o, dict):
        for k, v in o.items():
            yield from flat(v, f"{key}.{k}" if key else str(k))
    elif isinstance(o, list) and any(isinstance(v, (dict, torch.Tensor)) for v in o):
        for i, v in enumerate(o):
            yield from flat(v, f"{key}.{i}" if key else str(i))
ok = 0
for key, t in flat(sd):
    h = hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
    assert listing["tensors"][key]["sha256"] == h, key
    ok += 1
print(f"top-level keys: {list(sd)}")
print(f"epoch={sd['epoch']} global_step={sd['global_step']} lr={sd['optimizer_states'][0]['param_groups'][0]['lr']}")
print(f"{ok} tensors: PyTorch's SHA-256 == shardpoint's for every one")
PY
echo
echo "demo: OK"

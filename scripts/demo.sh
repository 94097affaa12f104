#!/usr/bin/env bash
# The main job (grows with each issue). Now: write a torch.save file with shardpoint,
# inspect it, and load it in Debian's PyTorch.
set -euo pipefail
BUILD=${1:-build}
echo "shardpoint $($BUILD/src/cli/shardpoint --version 2>/dev/null || echo '(dev)')"

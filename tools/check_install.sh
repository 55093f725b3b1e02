#!/usr/bin/env bash
# Install fastrl_per as the README says a user does (it is on no registry yet), into a fresh venv away from the clone:
# first the wheel built in the clone, with no extra (the buffers, the pipes and the learner must work, and `fastrl_per
# train` must name the cli extra in one line), then `pip install '.[cli]'` from the clone (the main job must run).
# Prints each install's size.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q torch==2.13.0
"$py" -m pip wheel -q --no-deps -w "$work/dist" "$repo"
wheel=$(cd "$work/dist" && ls fastrl_per-*.whl)
grep -qF "pip install dist/$wheel" "$repo/README.md" ||
  { echo "README.md does not name the wheel pip builds: $wheel"; exit 1; }
"$py" -m pip install -q "$work/dist/$wheel"
"$py" -m pip check
cd "$work"
"$py" - <<'PY'
import torch
from fastrl_per.all import GymTransformBlock, PrioritizedReplayBuffer, Learner
buf = PrioritizedReplayBuffer(max_sz=100, bs=8, seed=0)
for batch in GymTransformBlock(None, n=50, seed=0)(['CartPole-v1']): buf.add(batch)
sample = buf.sample()
buf.update_priorities(sample.idxs, torch.randn(8))
assert len(buf) == 50 and sample.state.shape == (8, 4)
assert len(Learner('CartPole-v1', seed=0, total_steps=300, warmup=100).fit(300)) > 0
PY
if out=$("$work/venv/bin/fastrl_per" train --steps 100 --out "$work/run" 2>&1); then
  echo "fastrl_per train ran without the cli extra: $out"; exit 1
fi
grep -qF "pip install 'fastrl_per[cli]'" <<<"$out" || { echo "fastrl_per train did not name the cli extra: $out"; exit 1; }
[ ! -e "$work/run" ] || { echo "the refused run left $work/run behind"; exit 1; }
lean=$(du -sm "$work/venv" | cut -f1)
"$py" -m pip install -q "$repo[cli]"
"$work/venv/bin/fastrl_per" train --steps 300 --out "$work/run" --no-progress >/dev/null
echo "wheel install checked: no extra ${lean} MB, with the cli extra $(du -sm "$work/venv" | cut -f1) MB (torch $("$py" -c 'import torch; print(torch.__version__)'))"

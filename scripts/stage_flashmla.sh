#!/usr/bin/env bash
# Builds the FlashMLA benchmark peer (issue 16; bench/peer/README.md): exports FlashMLA's csrc/ and
# CUTLASS's include/ from two git directories into .peer/ (ignored by git: nothing of either is ever
# tracked), compiles the few FlashMLA SM90 kernel files the peer times (no torch: only the kernel
# launchers, whose parameter structs the driver fills) and links them with bench/peer/flashmla_peer.cu
# into .peer/bin/flashmla_peer (static cudart, sm_90a SASS only: small enough to carry to the GPU machine,
# which then only runs the binary).
#
#   scripts/stage_flashmla.sh [FLASHMLA_GIT_DIR [CUTLASS_GIT_DIR]]
#
# Defaults: the mirrors the fetch tool leaves under /work/.mirror. FlashMLA is exported at its HEAD and
# CUTLASS at the commit FlashMLA pins as its csrc/cutlass submodule (HEAD when the mirror lacks it, with a
# warning). The sources are re-exported only when a commit changes (.peer/*/.commit); objects are rebuilt
# only when older than their inputs. Where the git directories are absent (the GPU machine, with .peer
# carried) it builds from the sources already exported. NVCC_THREADS (default 2) sets nvcc --threads, JOBS
# (default 2) the number of files compiled at once.
set -euo pipefail
cd "$(dirname "$0")/.."
fm_git=${1:-/work/.mirror/deepseek-ai+FlashMLA/repo}
cu_git=${2:-/work/.mirror/NVIDIA+cutlass/repo}
peer=.peer
NVCC=${NVCC:-nvcc}
JOBS=${JOBS:-2}
start=$(date +%s)

# ---- sources ----
mkdir -p "$peer/bin" "$peer/obj"
export_tree() {  # export_tree GIT_DIR COMMIT PATH DEST: PATH of COMMIT into DEST, unless already there
  local git=$1 commit=$2 path=$3 dest=$4
  if [ "$(cat "$dest/.commit" 2>/dev/null)" = "$commit" ]; then return; fi
  rm -rf "$dest"
  mkdir -p "$dest"
  # A partial mirror may report blobs outside PATH as invalid objects; the file count below is the check.
  git --git-dir="$git" archive "$commit" "$path" | tar -x -C "$dest"
  local want got
  want=$(git --git-dir="$git" ls-tree -r "$commit" "$path" | grep -vc '^160000' || true)
  got=$(find "$dest" -type f -o -type l | wc -l)
  [ "$want" = "$got" ] || { echo "export of $path @ $commit: $got files, expected $want" >&2; exit 1; }
  echo "$commit" > "$dest/.commit"
  echo "exported $path @ $commit -> $dest ($got files)"
}
if git --git-dir="$fm_git" rev-parse -q --verify HEAD >/dev/null 2>&1 &&
  git --git-dir="$cu_git" rev-parse -q --verify HEAD >/dev/null 2>&1; then
  fm_commit=$(git --git-dir="$fm_git" rev-parse HEAD)
  cu_pin=$(git --git-dir="$fm_git" ls-tree HEAD csrc/cutlass | awk '{print $3}')
  if [ -n "$cu_pin" ] && git --git-dir="$cu_git" cat-file -e "$cu_pin^{commit}" 2>/dev/null; then
    cu_commit=$cu_pin
  else
    cu_commit=$(git --git-dir="$cu_git" rev-parse HEAD)
    echo "warning: CUTLASS mirror lacks FlashMLA's pinned commit ${cu_pin:-?}; using its HEAD $cu_commit" >&2
  fi
  export_tree "$fm_git" "$fm_commit" csrc "$peer/flashmla"
  export_tree "$cu_git" "$cu_commit" include "$peer/cutlass"
elif [ -f "$peer/flashmla/.commit" ] && [ -f "$peer/cutlass/.commit" ]; then
  echo "no git directories at $fm_git / $cu_git: building from the sources already in $peer"
else
  echo "no FlashMLA / CUTLASS git directories and nothing exported in $peer" >&2
  exit 1
fi
echo "FlashMLA $(cat "$peer/flashmla/.commit"), CUTLASS $(cat "$peer/cutlass/.commit")"

# ---- compile ----
# FlashMLA's own nvcc flags (its setup.py) for the sm_90a part, minus the debug/PTX-listing ones; fp16
# instantiations are left out (the peer times bf16 only).
src=$peer/flashmla/csrc
flags=(-std=c++20 -O3 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16
  -gencode arch=compute_90a,code=sm_90a
  -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__
  -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
  --ptxas-options=--register-usage-level=10 -Wno-deprecated-declarations --threads "${NVCC_THREADS:-2}"
  -I"$src" -I"$src/kerutils/include" -I"$src/sm90" -I"$peer/cutlass/include")
# The kernel files: the sparse FP8 decode ("V32" KV layout, 64 and 128 heads), the sparse prefill (d_qk
# 576, no topk_length), the dense bf16 decode, the decode scheduler and the split-KV combine.
kernels=(
  sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu
  sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu
  sm90/prefill/sparse/instantiations/phase1_k576.cu
  sm90/decode/dense/instantiations/bf16.cu
  smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu
  smxx/decode/combine/combine.cu
)
objs=()
pids=()
for k in "${kernels[@]}"; do
  o=$peer/obj/$(echo "$k" | tr / _ | sed 's/\.cu$/.o/')
  objs+=("$o")
  if [ -f "$o" ] && [ "$o" -nt "$src/.." ] && [ "$o" -nt "$src/$k" ]; then continue; fi
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  (
    t0=$(date +%s)
    "$NVCC" "${flags[@]}" -c "$src/$k" -o "$o.tmp" && mv "$o.tmp" "$o"
    echo "compiled $k in $(($(date +%s) - t0)) s"
  ) &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ "$fail" = 0 ] || { echo "a FlashMLA kernel file failed to compile" >&2; exit 1; }

# The driver (ours), linked with them; static cudart, and libcuda through cudart's driver entry points.
"$NVCC" "${flags[@]}" -Ibench -Ibench/peer bench/peer/flashmla_peer.cu "${objs[@]}" -cudart static \
  -o "$peer/bin/flashmla_peer"
ls -la "$peer/bin/flashmla_peer"
echo "stage_flashmla: built in $(($(date +%s) - start)) s"

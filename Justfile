# dflash front door. Every recipe here does real work; see README.md.
set shell := ["bash", "-euo", "pipefail", "-c"]

export UV_PYTHON_DOWNLOADS := "never"

# CUDA toolkit variant of the environment: an extra of pyproject.toml (cu128 | cu130)
extra := env("DFLASH_EXTRA", "cu128")

# `uv run` would re-sync to the default (no-extra) set and drop torch: always --no-sync
run := "uv run --frozen --no-sync"

default:
    @just --list

# Create .venv exactly from uv.lock for the chosen CUDA variant
setup:
    uv sync --frozen --extra {{extra}}

# Python sources under the quality gate, named (ruff's default excludes skip folders like `dist`)
src := "dflash bench images tests"

# Type-checked sources: the product and its scripts (tests are checked by running them)
typed := "dflash bench images"

# Lint, format and type check (the one quality gate, same here and in CI)
check: setup
    {{run}} ruff check {{src}}
    {{run}} ruff format --check {{src}}
    {{run}} mypy {{typed}}

# Quality gate, then the whole test suite (pass extra pytest args after `test`)
test *ARGS: check
    {{run}} pytest {{ARGS}}

# Train a drafter, e.g. `just train --preset tiny --data random --max-steps 30 --out runs/tiny`
train *ARGS: setup
    {{run}} dflash train {{ARGS}}

# Offline end-to-end demo on CPU: tiny target from stdlib sources, regenerated data, drafter, eval and plot
demo *ARGS: setup
    {{run}} dflash demo {{ARGS}}

# Audit this environment against uv.lock (and the image manifest): contamination, shadowed libraries, stale caches
doctor *ARGS: setup
    {{run}} dflash doctor {{ARGS}}

# GPU readiness, one script (docs/bench.md): doctor, 20 compiled qwen3-8b-1gpu steps with no recompile, its bench record, a 1+1 NCCL pipeline on >= 2 GPUs; --dry-run: the same at tiny shapes on CPU
gpu-check *ARGS: setup
    {{run}} dflash gpu-check {{ARGS}}

# Apply ruff's fixes and formatting
fmt: setup
    {{run}} ruff check --fix {{src}}
    {{run}} ruff format {{src}}

# --- Container images (README "Images"). Engine: DFLASH_ENGINE=docker|podman (auto);
# behind a TLS-intercepting proxy set DFLASH_CA_BUNDLE to a PEM bundle (build secret).
images := "python3 images/build.py"

# Build the Debian base image with debootstrap (root; skipped if it exists, --refresh rebuilds)
base *ARGS:
    {{images}} base {{ARGS}}

# Build VARIANT's image, run its smoke stage, tag dflash:VARIANT-KEY, move dflash:VARIANT and :latest
build VARIANT *ARGS:
    {{images}} build {{VARIANT}} {{ARGS}}

# Print the content key of VARIANT's image for the current sources (-v lists every input)
image-key VARIANT *ARGS:
    {{images}} key {{VARIANT}} {{ARGS}}

# Remove VARIANT's current image and the pointers to it (--all: every key tag; --base: the base too)
rmi VARIANT *ARGS:
    {{images}} rm {{VARIANT}} {{ARGS}}

# Tests against the built VARIANT image: no-op rebuild, labels, containers started from it (doctor, train, stop/resume, pip install, bench, paired image bench), image diff (with a second build whose lock differs by one package); extra pytest args after VARIANT
test-images VARIANT="cu128" *ARGS: setup
    DFLASH_TEST_IMAGE="$({{images}} tag {{VARIANT}})" {{run}} pytest tests/test_images.py tests/test_containers.py tests/test_bench_image_pairs.py tests/test_bench_image_bisect.py tests/test_image_diff.py -ra {{ARGS}}

# --- Throughput benchmarks (docs/bench.md). Store: $DFLASH_BENCH_STORE or ~/.cache/dflash/bench

# Run a workload (default tiny-cpu; --workload qwen3-8b-1gpu on a GPU, --image dflash:cu128 in an image); exit 1 on a regression
bench *ARGS: setup
    {{run}} dflash bench run {{ARGS}}

# Promote a record (default: the latest of --workload) to the baseline of its (hardware, workload, CUDA variant)
bench-accept *ARGS: setup
    {{run}} dflash bench accept {{ARGS}}

# Markdown table and PNG of tok/s per environment over time, regressions marked (default into STORE/report/)
bench-report *ARGS: setup
    {{run}} dflash bench history {{ARGS}}

# pytest-benchmark micro-benchmarks; saved as JSON in the store's micro/ and compared with the previous save
bench-micro *ARGS: setup
    {{run}} pytest tests/microbench -o python_files='bench_*.py' -p no:cacheprovider --benchmark-autosave --benchmark-storage="file://${DFLASH_BENCH_STORE:-$HOME/.cache/dflash/bench}/micro" --benchmark-compare {{ARGS}}

# False-alarm and detection rates of the stored-number verdict on this machine (41 bench runs, none paired)
bench-quality *ARGS: setup
    {{run}} python bench/stat_quality.py {{ARGS}}

# The same for the paired verdict (the default of `just bench`): --phase none|candidate|baseline
bench-quality-paired *ARGS: setup
    {{run}} python bench/paired_quality.py {{ARGS}}

# One training step of our drafter against vLLM speculators' DFlash on CPU, same shapes, interleaved fresh processes (builds speculators' own venv with uv); prints the time ratio last
bench-peer *ARGS: setup
    {{run}} python bench/peer_step.py {{ARGS}}

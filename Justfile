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

# Lint and format check (the one quality gate, same here and in CI)
check: setup
    {{run}} ruff check .
    {{run}} ruff format --check .

# Quality gate, then the whole test suite (pass extra pytest args after `test`)
test *ARGS: check
    {{run}} pytest {{ARGS}}

# Train a drafter, e.g. `just train --preset tiny --data random --max-steps 30 --out runs/tiny`
train *ARGS: setup
    {{run}} dflash train {{ARGS}}

# Apply ruff's fixes and formatting
fmt: setup
    {{run}} ruff check --fix .
    {{run}} ruff format .

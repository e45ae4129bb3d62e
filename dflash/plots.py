"""Training curves: drafter loss and acceptance length (tau) against step, one PNG."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir: Path, tau_points: list[tuple[int, float]], out: Path, block_size: int):
    """Loss (from RUN/metrics.jsonl) and tau (evaluated checkpoints) against step."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on machines without a display
    import matplotlib.pyplot as plt

    metrics = read_metrics(run_dir)
    fig, (ax_loss, ax_tau) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], marker=".")
    ax_loss.set(xlabel="step", ylabel="training loss", title="drafter loss")
    if tau_points:
        steps, taus = zip(*tau_points, strict=True)
        ax_tau.plot(steps, taus, marker="o")
    ax_tau.axhline(1.0, color="grey", lw=0.5)
    ax_tau.set(
        xlabel="step",
        ylabel=f"tau (mean accepted + 1), bs {block_size}",
        title="acceptance length on held-out prompts",
        ylim=(0, block_size + 0.5),
    )
    for ax in (ax_loss, ax_tau):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

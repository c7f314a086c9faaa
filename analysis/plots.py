"""Figures from tidy results. Reads only files (runs.parquet and per-run tables)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.tables import load_iterations, load_runs  # noqa: E402


def iteration_time_plot(sweep_dir: Path, out: Path | None = None) -> Path:
    """Per-iteration time of each worker, one box per scheduler, beside the split of the
    median iteration into compute and time blocked on communication."""
    runs = load_runs(sweep_dir, status="ok")
    iters = load_iterations(sweep_dir, runs)
    iters["iteration_ms"] = (iters["end"] - iters["start"]) * 1e3
    order = list(dict.fromkeys(runs.sort_values("iter_time_median_s", ascending=False)["scheduler"]))

    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    sns.boxplot(data=iters, x="scheduler", y="iteration_ms", order=order, ax=ax1, color="#cfe0f3",
                showfliers=False)
    sns.stripplot(data=iters, x="scheduler", y="iteration_ms", hue="worker", order=order, ax=ax1,
                  dodge=True, size=3, alpha=0.7, palette="deep")
    ax1.set(xlabel="scheduler", ylabel="iteration time (ms)", title="Iteration time per worker")
    ax1.set_ylim(bottom=0)
    ax1.legend(title="worker", fontsize=8, title_fontsize=8, loc="lower right")

    med = iters.groupby("scheduler")[["compute_s", "wait_s"]].median().reindex(order) * 1e3
    med.plot(kind="barh", stacked=True, ax=ax2, color=["#4c72b0", "#dd8452"])
    ax2.set(xlabel="median per iteration (ms)", ylabel="", title="Compute vs. blocked on communication")
    ax2.legend(["compute", "waiting for gradients"], fontsize=8, loc="lower right")

    first = runs.iloc[0]
    fig.suptitle(f"{first['sweep']}: {first['workload.model']} ({first['workload.preset']}), "
                 f"{runs['num_workers'].iloc[0]} workers, {first['compute_mode']} compute; "
                 f"warm-up iterations excluded", fontsize=10)
    fig.tight_layout()
    out = out or sweep_dir / "iteration_time.png"
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def summary_table(sweep_dir: Path) -> pd.DataFrame:
    runs = load_runs(sweep_dir)
    cols = ["run_id", "scheduler", "repeat", "status", "iter_time_median_s", "wait_median_s",
            "compute_median_s", "samples_per_s", "final_loss", "params_consistent", "wall_s", "reason"]
    return runs[[c for c in cols if c in runs.columns]]

"""Figures from tidy results. Reads only files (runs.parquet and per-run tables)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.tables import load_iterations, load_runs  # noqa: E402


def iteration_time_plot(sweep_dir: Path, out: Path | None = None, run_ids: list[str] | None = None) -> Path:
    """Per-iteration time of each worker, one box per scheduler, beside the split of the
    median iteration into compute and time blocked on communication."""
    runs = load_runs(sweep_dir, status="ok", run_ids=run_ids)
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
    ax1.set_ylim(bottom=0, top=iters["iteration_ms"].max() * 1.15)
    if "fifo" in order:
        base = iters.loc[iters["scheduler"] == "fifo", "iteration_ms"].median()
        for i, name in enumerate(order):
            m = iters.loc[iters["scheduler"] == name, "iteration_ms"].median()
            ax1.annotate(f"{base / m:.2f}x vs fifo", (i, iters["iteration_ms"].max() * 1.07), ha="center",
                         fontsize=9, color="#333")
    ax1.legend(title="worker", fontsize=8, title_fontsize=8, loc="lower right")

    med = iters.groupby("scheduler")[["compute_s", "wait_s"]].median().reindex(order) * 1e3
    med.plot(kind="barh", stacked=True, ax=ax2, color=["#4c72b0", "#dd8452"])
    ax2.set(xlabel="median per iteration (ms)", ylabel="", title="Compute vs. blocked on communication")
    ax2.legend(["compute", "waiting for gradients"], fontsize=8, loc="lower right")

    first = runs.iloc[0]
    fig.suptitle(f"{first['sweep']}: {first['workload.model']} ({first['workload.preset']}, "
                 f"{first['num_params'] / 1e3:.0f}k params), {runs['num_workers'].iloc[0]} workers, "
                 f"{first['compute_mode']} compute; {first.get('topology.kind', '')}: {first.get('network', '')}; "
                 f"warm-up excluded", fontsize=9)
    fig.tight_layout()
    out = out or sweep_dir / "iteration_time.png"
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def summary_table(sweep_dir: Path, run_ids: list[str] | None = None) -> pd.DataFrame:
    runs = load_runs(sweep_dir, run_ids=run_ids)
    cols = ["run_id", "scheduler", "repeat", "status", "iter_time_median_s", "wait_median_s",
            "compute_median_s", "bound_s", "efficiency", "fidelity_ok", "final_loss", "params_consistent",
            "wall_s", "reason"]
    return runs[[c for c in cols if c in runs.columns]]

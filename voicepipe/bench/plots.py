"""Pictures of benchmark results (matplotlib, drawn off-screen)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_report(report: dict, path: str) -> None:
    if "sweep" in report:
        fig = plot_sweep(report["sweep"])
    else:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        modes = {k: v for k, v in report["modes"].items() if "throughput_tok_s" in v}
        axes[0].bar(list(modes), [m["throughput_tok_s"] for m in modes.values()], color="#4c72b0")
        axes[0].set_title("throughput (tok/s)")
        axes[1].bar(list(modes), [m["latency_p99_s"] for m in modes.values()], color="#dd8452")
        axes[1].set_title("p99 request latency (s)")
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(rows: list[dict]):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for seqs in sorted({r["max_batch_seqs"] for r in rows}):
        line = sorted((r for r in rows if r["max_batch_seqs"] == seqs), key=lambda r: r["max_batch_tokens"])
        xs = [r["max_batch_tokens"] for r in line]
        axes[0].plot(xs, [r["throughput_tok_s"] for r in line], marker="o", label=f"max_batch_seqs={seqs}")
        axes[1].plot(xs, [r["latency_p99_s"] for r in line], marker="o", label=f"max_batch_seqs={seqs}")
    for ax, title in zip(axes, ("throughput (tok/s)", "p99 latency (s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_batch_tokens")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

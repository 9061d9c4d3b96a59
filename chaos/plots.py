"""PNG plots of a chaos result (matplotlib, no display needed).

- round-NN.png: ring throughput (tuples applied per second) and the total backup-buffer
  size over time, with the faults marked (the paper's Fig. 8a);
- recovery.png: recovery latency against the number of simultaneous failures, every
  failure a dot, p50 and max as lines, beside the paper's range and our target
  (the paper's Fig. 8b).
"""

from __future__ import annotations

import sys
from pathlib import Path

PLOTS_EXTRA = "plots skipped: matplotlib is not installed (pip install 'floe-ring[plots]')"


def pyplot():
    """matplotlib's pyplot without a display, or None (and one line on stderr saying
    which extra to install) when matplotlib is missing: results never depend on it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError:
        print(PLOTS_EXTRA, file=sys.stderr, flush=True)
        return None
    return matplotlib.pyplot


_COLOURS = {"kill": "tab:red", "pause": "tab:orange", "kill-mapper": "tab:purple",
            "kill-mid-handoff": "tab:brown"}


def plot_round(round_result: dict, path: Path, title: str, plt) -> Path:
    series = round_result["series"]
    t = [p["t"] for p in series]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5))
    top.plot(t, [p["applied_per_s"] for p in series], color="tab:blue", lw=1.2)
    top.set_ylabel("tuples applied / s")
    bottom.plot(t, [p["backup_tuples"] for p in series], color="tab:green", lw=1.2)
    bottom.set_ylabel("backup buffer (tuples)")
    bottom.set_xlabel("seconds since the load started")
    seen = set()
    for inj in round_result["injected"]:
        colour = _COLOURS.get(inj["kind"], "black")
        label = f"{inj['kind']} {','.join(inj['victims'])}"
        for ax in (top, bottom):
            ax.axvline(inj["at_s"], color=colour, ls="-", lw=1.5,
                       label=label if ax is top and label not in seen else None)
            if inj.get("resumed"):
                ax.axvline(inj["resumed"] - round_result["load_started"], color=colour,
                           ls="--", lw=1.2, label="SIGCONT" if ax is top else None)
        seen.add(label)
    t0 = round_result["load_started"]
    applying = [tl["applying"] - t0 for tl in round_result["timelines"] if tl["applying"]]
    if applying:
        top.axvline(max(applying), color="black", ls=":", lw=1.2,
                    label="all ranges applying again")
    top.legend(loc="lower right", fontsize=8)
    top.set_title(title, fontsize=10)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_recovery(result: dict, path: Path, title: str, plt) -> Path:
    points: dict[int, list[tuple[float | None, float | None]]] = {}
    for r in result["rounds"]:
        for tl in r["timelines"]:
            if tl["kind"] == "kill":
                points.setdefault(tl["simultaneous"], []).append(
                    (tl["applying_ms"], tl["taken_over_ms"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = sorted(points)
    ax.axhspan(700, 1500, color="tab:gray", alpha=0.15, label="paper: 700-1500 ms")
    ax.axhline(300, color="tab:green", ls="--", lw=1, label="target p50 300 ms")
    ax.axhline(1000, color="tab:red", ls="--", lw=1, label="target max 1 s")
    for idx, (name, colour, marker) in enumerate((("applying again", "tab:blue", "o"),
                                                  ("taken over", "tab:orange", "x"))):
        xs, ys, p50, worst = [], [], [], []
        for k in ks:
            vals = sorted(x for x in (v[idx] for v in points[k]) if x is not None)
            xs += [k + (idx - 0.5) * 0.12] * len(vals)
            ys += vals
            p50.append(vals[(len(vals) - 1) // 2] if vals else float("nan"))
            worst.append(vals[-1] if vals else float("nan"))
        ax.scatter(xs, ys, s=14, color=colour, marker=marker, alpha=0.6,
                   label=f"{name} (each failure)")
        ax.plot(ks, p50, color=colour, lw=1.5, label=f"{name} p50")
        ax.plot(ks, worst, color=colour, lw=1, ls=":", label=f"{name} max")
    ax.set_xticks(ks)
    ax.set_xlabel("nodes SIGKILLed at once (non-adjacent)")
    ax.set_ylabel("ms after the kill")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_result(result: dict, out: Path, max_round_plots: int = 6) -> list[str]:
    """The PNGs of a result, or none (said in one line) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    out = Path(out)
    sc = result["scenario"]
    made = []
    for r in result["rounds"][:max_round_plots]:
        if r["series"]:
            title = (f"{sc['name']} round {r['index'] + 1} ({r['label']}): n={sc['nodes']} "
                     f"r={sc['replicas']}, {sc['load']['keys']} load "
                     f"{sc['load']['rate'] * sc['load']['mappers']:.0f} tuples/s")
            made.append(str(plot_round(r, out / f"round-{r['index'] + 1:02d}.png", title,
                                        plt)))
    if any(tl["kind"] == "kill" for r in result["rounds"] for tl in r["timelines"]):
        title = (f"{sc['name']}: recovery after SIGKILL, n={sc['nodes']} r={sc['replicas']}, "
                 f"seed {result['seed']}")
        made.append(str(plot_recovery(result, out / "recovery.png", title, plt)))
    return made

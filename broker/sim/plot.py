"""Timeline plots of simulated runs (matplotlib is imported only here, lazily)."""
from __future__ import annotations

from spotbroker.broker.placement.policy.model import Capacity
from spotbroker.broker.sim.engine import Job
from spotbroker.broker.sim.runner import WindowRun

MAX_RUNS = 8  # one row per run; more would be unreadable


def plot_runs(runs: list[WindowRun], zones: list[str], gap_s: int, job: Job, path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = runs[:MAX_RUNS]
    fig, axes = plt.subplots(len(shown), 2, figsize=(14, 2.6 * len(shown)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    hours = gap_s / 3600
    for row, run in zip(axes, shown):
        place, prog = row
        steps = run.result.timeline
        names = [run.zone] if run.zone is not None else zones
        # which zone runs what, tick by tick
        for capacity, colour in ((Capacity.SPOT, "tab:green"), (Capacity.ON_DEMAND, "tab:red")):
            labelled = False
            for zi in range(len(names)):
                spans = [(s.tick * hours, hours) for s in steps if s.zone == zi and s.capacity is capacity]
                if spans:
                    place.broken_barh(spans, (zi - 0.35, 0.7), color=colour,
                                      label=None if labelled else capacity.value)
                    labelled = True
        previous = None
        for s in steps:
            if s.preempted and previous is not None and previous.zone is not None:
                place.plot(s.tick * hours, previous.zone, "kx", markersize=5)
            previous = s
        place.set_yticks(range(len(names)), names)
        place.set_xlim(0, job.deadline_s / 3600)
        label = f"start tick {run.start_tick}" + (f", {run.zone}" if run.zone else "")
        place.set_title(f"{title} {label}: ${run.result.cost:.2f}"
                        f" ({'deadline met' if run.result.deadline_met else 'DEADLINE MISSED'}); x = preempted",
                        fontsize=9)
        if place.get_legend_handles_labels()[0]:
            place.legend(loc="upper right", fontsize=7)
        # progress against the deadline and the last moment on-demand could still make it
        t = [s.tick * hours for s in steps]
        prog.plot(t, [s.progress_s / 3600 for s in steps], color="tab:blue", label="progress")
        d_h, p_h = job.deadline_s / 3600, job.work_s / 3600
        prog.axvline(d_h, color="k", linestyle="--", label="deadline")
        prog.plot([d_h - p_h - job.restart_s / 3600, d_h - job.restart_s / 3600], [0, p_h], color="tab:red",
                  linestyle=":", label="latest on-demand line")
        prog.axhline(p_h, color="grey", linewidth=0.5)
        prog.set_xlim(0, d_h * 1.02)
        prog.set_xlabel("hours", fontsize=8)
        prog.set_ylabel("work done (h)", fontsize=8)
        prog.legend(loc="upper left", fontsize=7)
    if len(runs) > MAX_RUNS:
        fig.suptitle(f"first {MAX_RUNS} of {len(runs)} runs", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""PNG plots of a sweep report (matplotlib's Agg backend: no display needed).

Each plot is made only when the sweep varied what it shows (two or more batch sizes for a
throughput-vs-batch curve, and so on), so a report never carries an empty chart.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

log = logging.getLogger("gpubench")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _log2_axis(ax, xs) -> None:
    """Batch sizes on a log2 axis, labelled with the sizes themselves (not 2^k)."""
    ax.set_xscale("log", base=2)
    ticks = sorted({x for x in xs if x})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def _ceiling(rows) -> float:
    return Counter(r.ceiling for r in rows).most_common(1)[0][0]


def _by_precision(rows):
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(str(r.knob("precision") or "?"), []).append(r)
    return sorted(groups.items())


def _best_curve(rows, knob: str, out: Path, xlabel: str, rec, log2: bool) -> Path | None:
    """Best feasible throughput at each value of `knob`, one line per precision (full-length
    measurements only, as the recommendation)."""
    ok = [r for r in rows if r.feasible and r.full and r.knob(knob) is not None]
    if len({r.knob(knob) for r in ok}) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for prec, rs in _by_precision(ok):
        best: dict = {}
        for r in rs:
            x = r.knob(knob)
            best[x] = max(best.get(x, 0.0), r.throughput)
        xs = sorted(best)
        ax.plot(xs, [best[x] for x in xs], marker="o", label=prec)
    if rec is not None and rec.chosen.knob(knob) is not None:
        ax.plot([rec.chosen.knob(knob)], [rec.chosen.throughput], marker="*", markersize=16,
                color="gold", markeredgecolor="black", linestyle="none", label="recommended")
    if log2:
        _log2_axis(ax, [r.knob(knob) for r in ok])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("e2e images/sec (best feasible)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(title="precision")
    return _save(fig, out)


def memory_vs_batch(rows, out: Path) -> Path | None:
    pts = [r for r in rows if r.knob("batch_size") is not None
           and (r.peak is not None or r.status == "oom")]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for prec, rs in _by_precision(pts):
        fine = [r for r in rs if r.status != "oom" and r.peak is not None]
        ax.scatter([r.knob("batch_size") for r in fine], [100 * r.peak for r in fine], label=prec)
    oom = [r for r in pts if r.status == "oom"]
    if oom:  # an OOM's peak is the whole device
        ax.scatter([r.knob("batch_size") for r in oom], [100.0] * len(oom), marker="x",
                   color="red", s=60, label="out of memory")
    ax.axhline(100 * _ceiling(rows), color="red", linestyle="--", label="memory.ceiling")
    _log2_axis(ax, [r.knob("batch_size") for r in pts])
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak memory, % of the device")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out)


def pareto(rows, out: Path, rec) -> Path | None:
    """Throughput against peak memory: the front is what no other configuration beats on both."""
    pts = [r for r in rows if r.throughput > 0 and r.peak is not None]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    feas = [r for r in pts if r.feasible]
    infeas = [r for r in pts if not r.feasible]
    ax.scatter([100 * r.peak for r in feas], [r.throughput for r in feas], label="feasible")
    if infeas:
        ax.scatter([100 * r.peak for r in infeas], [r.throughput for r in infeas], color="grey",
                   label="over the ceiling")
    front, top = [], -1.0
    for r in sorted(pts, key=lambda r: (r.peak, -r.throughput)):
        if r.throughput > top:
            front.append(r)
            top = r.throughput
    ax.step([100 * r.peak for r in front], [r.throughput for r in front], where="post",
            color="black", alpha=0.6, label="Pareto front")
    ax.axvline(100 * _ceiling(rows), color="red", linestyle="--", label="memory.ceiling")
    if rec is not None and rec.chosen.peak is not None:
        ax.plot([100 * rec.chosen.peak], [rec.chosen.throughput], marker="*", markersize=16,
                color="gold", markeredgecolor="black", linestyle="none", label="recommended")
    ax.set_xlabel("peak memory, % of the device")
    ax.set_ylabel("e2e images/sec")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out)


def importance(study, out: Path, min_trials: int = 4) -> Path | None:
    """Optuna's parameter importance; needs a few completed trials with varied parameters."""
    import optuna
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varied = {k for k in (done[0].params if done else {})
              if len({repr(t.params.get(k)) for t in done}) > 1}
    if len(done) < min_trials or not varied:
        log.info("parameter importance skipped: %d completed trials, %d varied parameters",
                 len(done), len(varied))
        return None
    try:
        imp = optuna.importance.get_param_importances(study)
    except ImportError:  # fANOVA's forest needs scikit-learn; PED-ANOVA needs only numpy
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except Exception as e:
        log.info("parameter importance skipped: %s", e)
        return None
    if not imp:
        return None
    plt = _plt()
    names = list(imp)[::-1]
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(names) + 1.5))
    ax.barh(names, [imp[n] for n in names])
    ax.set_xlabel("importance for e2e images/sec (Optuna fANOVA)")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, out)


def plot_all(rows, out_dir: Path, rec, study=None) -> list[Path]:
    made = [
        _best_curve(rows, "batch_size", out_dir / "throughput_vs_batch.png", "batch size", rec,
                    log2=True),
        _best_curve(rows, "num_workers", out_dir / "throughput_vs_workers.png",
                    "loader workers", rec, log2=False),
        memory_vs_batch(rows, out_dir / "memory_vs_batch.png"),
        pareto(rows, out_dir / "pareto.png", rec),
    ]
    if study is not None:
        made.append(importance(study, out_dir / "importance.png"))
    return [p for p in made if p is not None]

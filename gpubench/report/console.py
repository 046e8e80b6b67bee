"""The terminal summary of a run (rich): it renders a RunRecord and nothing else."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpubench.analysis.labels import PHASE_WORDS, flaw_words, rerun_text
from gpubench.analysis.select import setup_text
from gpubench.config.schema import is_amp
from gpubench.config.settings import CHECKPOINT_WIRED, checkpointable
from gpubench.core.record import HEADLINE_ORDER, Bottleneck, Flaw, RunRecord, Status
from gpubench.core.stats import MIN_CPU_SPAN_S, TICK_S


def dash(v, spec: str, scale: float = 1.0, unit: str = "") -> str:
    return "-" if v is None else f"{v * scale:{spec}}{unit}"


def _gib(b) -> str:
    return dash(b, ".2f", 2**-30, " GiB")


def fold(line: str | Text, con: Console, lead: int | None = None) -> list[Text]:
    """A line (markup, or Text) folded between words at `con`'s width, each continuation under
    its text (`  1. `, `  - `, else two spaces in; `lead`: that many); a word longer than the
    width stays whole (a path folded would not paste). The terminal's fold breaks words."""
    text = Text.from_markup(line) if isinstance(line, str) else line
    plain = text.plain
    if any(c in plain for c in "\n\t\r\v\f"):  # textwrap turns these into spaces: not ours
        return [text]
    if lead is None:
        lead = len(plain) - len(plain.lstrip(" "))
        lead += len(m.group(0)) if (m := re.match(r"(\d+\.|-) ", plain[lead:])) else 2
    # a figure and its interval (`1664.0 [1226.6-2101.5]`) are one word: never apart
    glued = re.sub(r"(?<=[\d%]) (?=\[)", "\xa0", plain)
    parts = textwrap.wrap(glued, con.width, subsequent_indent=" " * lead,
                          break_long_words=False, break_on_hyphens=False)
    if len(parts) < 2 or lead >= con.width // 2:
        return [text]
    pieces, at = [], 0
    for i, part in enumerate(parts):  # the same words, cut from the styled text
        words = part if i == 0 else part[lead:]
        at = glued.index(words, at)
        pieces.append(Text(" " * lead * (i > 0)) + text[at:at + len(words)])
        at += len(words)
    return pieces


def title(rec: RunRecord) -> str:
    env, world = rec.env, rec.world_size or 1
    return (f"gpubench: {setup_text(rec)} | {env['device_name']} ({env['device']})"
            + (f", torchrun x{world}" if world > 1 else ""))


def fit(head: list[str], rows: list[list], drop: Sequence[int], width: int,
        right: Callable[[int], bool], **style) -> tuple[Table, list[int]]:
    """The table, columns left out in `drop`'s order until it fits (`1,26…` is another figure)."""
    measure = Console(width=10_000).measure  # the natural width, not one clamped to a console
    for n in range(len(drop) + 1):
        out = list(drop[:n])
        table = Table(**style)
        for c in (shown := [c for c in range(len(head)) if c not in out]):
            table.add_column(head[c], justify="right" if right(c) else "left", no_wrap=True)
        for r in rows:
            table.add_row(*(r[c] for c in shown))
        if measure(table).maximum <= width:
            break
    return table, out


# the phase table's columns, and the order they give way in a narrow terminal: the tail of the
# step times, memory (the line under the table says it), the step counts, then the rest
PHASE_COLUMNS = ("phase", "images/s", "interval", "p50 ms", "p95 ms", "data wait",
                 "steps (windows)", "peak mem")
PHASE_DROP = (4, 7, 6, 3, 5)
CUT_NOTE = "  * window closed by bench.max_seconds before bench.steps"  # the steps column's `*`


def phase_table(d: dict, interval_label: str, width: int = 10_000) -> tuple[Table, list[str]]:
    """A row per measured phase; the columns that do not fit `width` left out (and named)."""
    rows = []
    for name, ph in d["phases"].items():
        mem = ph["memory"].get("torch_peak_reserved_bytes") or ph["telemetry"].get("peak_rss_bytes")
        ci = ph.get("images_per_sec_ci")
        fmt = ",.0f" if ci and ci[1] >= 1000 else ",.1f"  # the interval stays one readable cell
        rows.append([
            PHASE_WORDS[name].title if name in PHASE_WORDS else name,
            dash(ph["images_per_sec"], ",.1f"),
            f"{ci[0]:{fmt}}-{ci[1]:{fmt}}" if ci else "-",
            dash(ph["step_time_p50_s"], ".1f", 1e3), dash(ph["step_time_p95_s"], ".1f", 1e3),
            dash(ph["data_wait_fraction"], ".0%") if name == "e2e" else "",
            f"{ph['steps']}{'*' if ph['truncated'] else ''} ({ph.get('repeats', 1)})", _gib(mem)])
    head = [*PHASE_COLUMNS[:2], interval_label, *PHASE_COLUMNS[3:]]
    table, out = fit(head, rows, PHASE_DROP, width, lambda c: c != 0)
    return table, [head[c] for c in out]


def _device_lines(d: dict) -> list[str]:
    out = []
    # the utilization figures are the headline phase's (run.summary.HEADLINE_TELEMETRY)
    during = next((f" during {n}" for n in HEADLINE_ORDER if n in d["phases"]), "")
    if d.get("gpu_util_mean") is not None:
        e = d.get("energy_per_image_j")
        out.append(
            f"GPU{during}: util mean {d['gpu_util_mean']:.0f}% (max {d['gpu_util_max']:.0f}%), "
            f"memory util {d['gpu_mem_util_mean']:.0f}%, power {d['power_mean_w']:.0f} W"
            + (f", {e:.3f} J/image" if e is not None else ""))
    # the peak is the whole run's (every phase's samples)
    rss = f"peak RSS {_gib(d['peak_rss_bytes'])} over the run (main + workers)"
    if d.get("host_cpu_util_mean") is not None:
        workers = d.get("workers_cpu_util_mean")
        split = "" if workers is None else (
            f": main {d['main_cpu_util_mean']:.0f}%, workers {workers:.0f}%")
        out.append(
            f"host CPU{during}: {d['host_cpu_util_mean']:.0f}% of {d['env']['cpu_count']} "
            f"cores; this run's processes {d['process_cpu_util_mean']:.0f}% (100% = one "
            f"core){split}; {rss}")
    elif d.get("peak_rss_bytes") is not None:  # sampled, but over too short a time for CPU
        out.append(f"host CPU not read: the windows cover under {MIN_CPU_SPAN_S:g} s and CPU "
                   f"time counts {TICK_S * 1e3:.0f} ms ticks (bench.min_window_s lengthens "
                   f"them); {rss}")
    info = d.get("data_info") or {}
    if info.get("preload_seconds") is not None:
        out.append(f"preload: {_gib(info.get('preload_bytes'))} decoded into RAM in "
                   f"{info['preload_seconds']:.1f} s (once, before the phases)")
    if d.get("read_mb_per_s") and d["config"]["dataset"]["name"] in ("imagefolder", "cifar10"):
        out.append(f"data read: {d['read_mb_per_s']:.1f} MB/s during the loader phase")
    if d.get("mfu") is not None:
        out.append(f"MFU {d['mfu']:.1%} ({d['achieved_tflops']:.1f} TFLOP/s achieved)")
    elif d.get("achieved_tflops") is not None:
        out.append(f"{d['achieved_tflops'] * 1e3:.1f} GFLOP/s achieved (no peak known for this "
                   "device: no MFU)")
    return out


def lines(d: dict, notes: list[str]) -> list[str]:
    """What the table does not show, as rich markup."""
    out = []
    if any(ph["truncated"] for ph in d["phases"].values()):
        out.append(CUT_NOTE)
    ceiling, of = dash(d["memory_ceiling"], ".0%"), _gib(d["device_memory_bytes"])
    if d.get("peak_memory_bytes") is None:  # nothing measured (failed while building)
        out.append(f"peak memory: not measured (ceiling {ceiling} of {of})")
    else:
        out.append(f"peak memory {_gib(d['peak_memory_bytes'])} = "
                   f"{dash(d['peak_memory_fraction'], '.0%')} of {of} ({d['memory_source']}; "
                   f"ceiling {ceiling})")
    out += _device_lines(d)
    if prof := d.get("profile"):
        ops = ", ".join(f"{o['name']} {o['self_ms_per_step']:.2f} ms" for o in prof["top_ops"][:3])
        out.append(f"profile ({prof['time_kind']} self time per step): {escape(ops)}")
        out.append(f"  trace: {prof['trace']} (open in https://ui.perfetto.dev)")
    out += [f"[dim]info: {note}[/dim]" for note in notes]
    if d.get("skipped_samples"):
        out.append(f"[yellow]{d['skipped_samples']} corrupt samples skipped[/yellow]")
    return out


def verdict(rec: RunRecord) -> list[str]:
    """The status when not ok, the narrowest pipe (or why none), the advice (rich markup)."""
    out = []
    if rec.status is not Status.ok:
        out.append(f"[bold red]status: {rec.status}[/bold red] {rec.error or ''}")
    if rec.status is Status.over_ceiling:
        out += [escape(line) for line in ceiling_advice(rec.config, rec.env.get("device"))]
    if rec.measurement_stable is False:
        out.append("[yellow]measurement unstable:[/yellow]")
        out += [f"  - {escape(r.text)}" for r in rec.noise_reasons]
        lean = rec.extra.get("verdict_leaning")
        kinds = [r.kind for r in rec.noise_reasons] or [Flaw.other]
        out.append("[bold]narrowest pipe: inconclusive[/bold]"
                   + (f" (the figures lean to {lean}, but the run was flagged: "
                      f"{', '.join(flaw_words(kinds))}; {rerun_text(kinds)})" if lean else ""))
    elif not rec.phases and rec.status is not Status.ok:
        return out  # it ended before measuring: no pipe to name, no advice
    else:
        out.append(f"[bold]narrowest pipe: {rec.bottleneck}[/bold] - {escape(rec.reason or '')}")
    if rec.bottleneck is Bottleneck.inconclusive and rec.advice:
        out.append("to get a verdict:")
    out += [f"  {i}. {escape(a)}" for i, a in enumerate(rec.advice, 1)]
    return out


def ceiling_advice(cfg: dict, device: str | None) -> list[str]:
    """The overrides that bring a run under memory.ceiling (amp_fp16 only on CUDA: a CPU refuses
    it), but those it used."""
    model, batch = cfg.get("model") or {}, (cfg.get("loader") or {}).get("batch_size")
    precision = (cfg.get("precision") or {}).get("name")
    out = []
    if isinstance(batch, int) and batch > 1:
        out.append(f"loader.batch_size={batch // 2}: a smaller batch (activations grow with it; "
                   "python -m gpubench sweep=max_batch finds the largest that fits)")
    if not model.get("checkpointing"):
        if model.get("_target_") is None and checkpointable(model.get("name", "")):
            out.append("model.checkpointing=true: recompute activations in backward instead "
                       "of keeping them (some compute for much less memory)")
        else:
            out.append(f"(activation checkpointing is not available here: {CHECKPOINT_WIRED})")
    if precision is not None and not is_amp(precision):
        fp16 = "" if device == "cpu" else " (or amp_fp16)"
        out.append(f"precision=amp_bf16{fp16}: mixed precision halves the activations")
    return ["to fit under memory.ceiling:", *(f"  - {a}" for a in out)]


def print_result(result, console: Console | None = None) -> None:
    """`result`: a RunRecord, or anything with `.record` (and `.notes`) such as runner.Result."""
    rec: RunRecord = getattr(result, "record", result)
    con = console or Console(highlight=False)
    d = rec.to_dict()
    say(con, title(rec))  # apart from the table: the table's width would fold it (`AMD\nEPYC`)
    out = [*lines(d, getattr(result, "notes", [])), *verdict(rec),
           f"[dim]results: {rec.path}[/dim]"]
    if d["phases"]:  # ended before its first window: the title alone, no empty table
        table, left = phase_table(d, rec.interval_label, con.width)
        con.print(table)
        if PHASE_COLUMNS[6] in left and out[0] == CUT_NOTE:  # its `*` went with the column
            out.pop(0)
        if left:
            out.insert(0, f"[dim]({', '.join(left)}: in results.json; a wider terminal shows "
                          "them)[/dim]")
    if d.get("picture"):
        out.append(f"[dim]picture: {d['picture']}[/dim]")
    for line in out:
        say(con, line)


def say(con: Console, line: str | Text, whole: bool = False) -> None:
    """Folded in a terminal; `whole`, or in a log or a pipe, never: its viewer folds itself."""
    for piece in [line] if whole or not con.is_terminal else fold(line, con):
        con.print(piece, soft_wrap=True)

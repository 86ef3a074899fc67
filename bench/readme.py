"""The documentation's figures, generated from bench/results/*.json; nothing in those sections is
typed. README.md holds the headline table; each other table sits in the docs/ page it belongs to
(PAGES).

`python -m bench readme` rewrites the generated sections (and docs/assets/ratios.png);
`python -m bench readme --check` exits 1 and prints the difference when a page is not what the
committed result files give. Each section sits between `<!-- bench:NAME:start -->` and
`<!-- bench:NAME:end -->`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from pathlib import Path

from turbotrain.core.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS, README, ASSETS = ROOT / "bench" / "results", ROOT / "README.md", ROOT / "docs" / "assets"  # ASSETS: generated figures
REFERENCE = ROOT / "docs" / "reference.md"  # the configuration reference, generated from the schemas
# (result file, row): the README's headline rows, one per thing a newcomer asks first
HEADLINE = (
    ("time_to_accuracy_bf16.json", 0),
    ("inference.json", 1),
    ("inference.json", 0),
    ("inference.json", 2),
    ("deploy_onnx.json", 1),
    ("deploy_onnx.json", 3),
    ("overhead.json", 0),
    ("overhead.json", 1),
)


def machine(hw: dict) -> str:
    """The hardware a result file names, as a table cell: CPU (threads, vector instructions where
    recorded), GPU, torch version."""
    where = f"{hw['gpu']}, " if hw.get("gpu") else ""
    isa = f", {' '.join(hw['isa'])}" if hw.get("isa") else ""
    return f"{where}{hw['cpu']} ({hw['cores']} threads{isa}), torch {hw['torch'].split('+')[0]}"


def _wall(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s:02d} s" if minutes else f"{s} s"


def _train_cell(t: dict) -> str:
    dtype = t["autocast_dtype"] or "fp32"
    text = (
        f"**{t['best_val_acc1']:.2%} top-1** (best epoch, validation split) after {t['epochs']} epoch(s), "
        f"**{_wall(t['wall_s'])}** wall for the whole command ({t['samples_per_s']:.0f} samples/s in training, "
        f"`precision={t['precision']}` ran {dtype}), {t['params'] / 1e6:.2f}M params"
    )
    c = t.get("compression")
    if c and c.get("macs_before"):
        text += (
            f"; {c['method']}: {c['macs_before'] / 1e6:.0f}M -> {c['macs_after'] / 1e6:.0f}M MACs "
            f"({1 - c['macs_after'] / c['macs_before']:.0%} fewer)"
        )
    return text


def _export_cell(e: dict) -> str:
    return (
        f"{e['size_mb']:.2f} MB vs {e['fp32_size_mb']:.2f} MB fp32 (**{e['size_mb'] / e['fp32_size_mb']:.2f}x**); "
        f"batch 1: {e['latency_ms']:.2f} ms vs {e['fp32_latency_ms']:.2f} ms fp32 eager "
        f"(**{e['fp32_latency_ms'] / e['latency_ms']:.1f}x**); batch 32: {e['latency_ms_b32']:.1f} vs "
        f"{e['fp32_latency_ms_b32']:.1f} ms ({e['fp32_latency_ms_b32'] / e['latency_ms_b32']:.1f}x); "
        f"top-1 {e['val_acc1']:.2%} vs {e['fp32_val_acc1']:.2%} float "
        f"({100 * (e['val_acc1'] - e['fp32_val_acc1']):+.2f} points); {e['dtype']}"
    )


def recipes(results: Path) -> str:
    """The main table: each headline run and its INT8 export (bench/results/recipes.json)."""
    path = results / "recipes.json"
    entries = json.loads(path.read_text())["recipes"]
    machines = sorted({machine(r["hardware"]) for r in entries.values()})
    lines = [
        f"Measured on {'; '.join(machines)} by `python -m bench recipes` (`bench/results/{path.name}`):",
        "",
        "| command | result |",
        "|---|---|",
    ]
    for r in entries.values():
        note = "" if len(machines) == 1 else f" ({machine(r['hardware'])})"
        lines.append(f"| {r['what']}{note} | {_train_cell(r['train'])} |")
        lines.append(f"| then `python export.py deploy=int8` | {_export_cell(r['export'])} |")
    return "\n".join(lines)


# result file's "bench" -> the function that computes its rows' figures from its raw measurements
FIGURES = {
    "inference": ("inference", "figures"),
    "deploy_onnx": ("deploy_onnx", "figures"),
    "prune": ("prune", "figures"),
    "conv_lowrank": ("prune", "figures"),
    "overhead": ("overhead", "figures"),
    "skip_sync": ("skip_sync", "figures"),
    "loader": ("loader", "figures"),
    "malloc": ("loader", "figures"),
    "loader_pipeline": ("decoded", "pipeline_figures"),
    "loader_cached_accuracy": ("decoded", "accuracy_figures"),
    "loader_in_memory_accuracy": ("decoded", "accuracy_figures"),
    "autotune": ("autotune", "figures"),
    "attention": ("attention", "figures"),
    "attention_flex": ("attention_flex", "figures"),
    "attention_accuracy": ("attention_accuracy", "figures"),
    "precision": ("train_speed", "precision_figures"),
    "text_precision": ("train_speed", "text_figures"),
    "time_to_accuracy": ("time_to_accuracy", "figures"),
    "data_scale": ("data_scale", "figures"),
    "cache_index": ("cache_index", "figures"),
    "resolution": ("resolution", "figures"),  # and its variants, resolution_* (so for every name)
}


def rows(result: dict) -> list[dict]:
    """The file's rows with their figures recomputed from its raw measurements: an edited number
    shows up in the README, not only an edited sentence."""
    import importlib

    name = max((k for k in FIGURES if result["bench"].startswith(k)), key=len)  # a variant: its bench's
    module, function = FIGURES[name]
    computed = getattr(importlib.import_module(f"bench.{module}"), function)(result)
    return [{**row, **figures} for row, figures in zip(result["rows"], computed, strict=True)]


def _result_rows(results: Path):
    """(file name, hardware, row) for every row of every result file, figures recomputed."""
    for path in sorted(results.glob("*.json")):
        result = json.loads(path.read_text())
        for row in rows(result) if "rows" in result else []:
            yield path.name, result["hardware"], row


def comparisons(results: Path) -> str:
    """The benchmark table: every row of every result file, hardware from that file."""
    lines = [
        "| comparison | seed claim | measured (median of interleaved repeats) | hardware | result |",
        "|---|---|---|---|---|",
    ]
    for name, hardware, row in _result_rows(results):
        lines.append(f"| {row['what']} | {row['seed']} | {row['ours']} | {machine(hardware)} | `bench/results/{name}` |")
    return "\n".join([*lines, "", "![ratios](assets/ratios.png)"])


def headline(results: Path) -> str:
    """The README's table: the HEADLINE rows, each with its hardware and its file."""
    lines = ["| what | measured (median of interleaved repeats) | hardware |", "|---|---|---|"]
    for name, index in HEADLINE:
        result = json.loads((results / name).read_text())
        row = rows(result)[index]
        lines.append(f"| {row['what']} | {row['ours']} | {machine(result['hardware'])}, `bench/results/{name}` |")
    return "\n".join(lines)


def time_to_accuracy(results: Path) -> str:
    import importlib

    return importlib.import_module("bench.time_to_accuracy").section(results)


def time_to_accuracy_text(results: Path) -> str:
    import importlib

    return importlib.import_module("bench.time_to_accuracy").section(results, "text")


def data_scale(results: Path) -> str:
    import importlib

    return importlib.import_module("bench.data_scale").section(results)


def mutation(results: Path) -> str:
    import importlib

    return importlib.import_module("bench.mutation_report").section(results)


def result_table(results: Path, name: str, how: str) -> str:
    """One result file's rows as a table, under the line naming its hardware, command and method."""
    path = results / f"{name}.json"
    result = json.loads(path.read_text())
    lines = [
        f"Measured on {machine(result['hardware'])} by `python -m bench {name}` (`bench/results/{path.name}`): {how}",
        "",
        "| comparison | measured |",
        "|---|---|",
    ]
    return "\n".join(lines + [f"| {row['what']} | {row['ours']} |" for row in rows(result)])


def cache_index(results: Path) -> str:
    before = json.loads((results / "cache_index.json").read_text())["before"]
    how = f'each open in a fresh process, arms interleaved, medians; "before" is commit {before}\'s JSON index.'
    return result_table(results, "cache_index", how)


SECTIONS: dict[str, Callable[[Path], str]] = {
    "headline": headline,
    "recipes": recipes,
    "time_to_accuracy": time_to_accuracy,
    "time_to_accuracy_text": time_to_accuracy_text,
    "data_scale": data_scale,
    "cache_index": cache_index,
    "comparisons": comparisons,
    "mutation": mutation,
}
# page -> the sections it holds
PAGES = {
    "README.md": ("headline",),
    "docs/recipes.md": ("recipes", "time_to_accuracy", "time_to_accuracy_text"),
    "docs/data.md": ("data_scale", "cache_index"),
    "docs/benchmarks.md": ("comparisons", "mutation"),
}


def render(text: str, results: Path, names: tuple[str, ...]) -> str:
    """`text` with each of its generated sections `names` replaced by what `results` gives."""
    for name in names:
        start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
        head, found, rest = text.partition(start)
        body, found_end, tail = rest.partition(end)
        if not (found and found_end):
            raise SystemExit(f"the markers {start} ... {end} are missing; put them where the section goes")
        text = f"{head}{start}\n{SECTIONS[name](results)}\n{end}{tail}"
    return text


def ratios(results: Path) -> list[tuple[str, float]]:
    return [(row["what"], row["ratio"]) for _, _, row in _result_rows(results) if row.get("ratio")]


def plot(pairs: list[tuple[str, float]], path: Path) -> None:
    """One horizontal bar per comparison that has a ratio (x: speed-up, 1 = no change)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 0.38 * len(pairs) + 1.2))
    labels = [label if len(label) <= 95 else label[:92] + "..." for label, _ in pairs]
    values = [v for _, v in pairs]
    ax.barh(range(len(values)), values, color=["#2a7" if v >= 1 else "#c44" for v in values])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ticks = [t for t in (0.25, 0.5, 1, 2, 4, 8, 16) if min(values) / 1.5 <= t <= max(values) * 1.5]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ratio (higher is better; 1 = baseline), medians of interleaved repeats")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check(results: Path = RESULTS, root: Path = ROOT) -> list[str]:
    """The diff lines between the pages and what `results` gives; empty when they agree."""
    diff = []
    for page, names in PAGES.items():
        text = (root / page).read_text()
        diff += difflib.unified_diff(text.splitlines(), render(text, results, names).splitlines(), page, "generated", lineterm="")
    return diff


def update(results: Path = RESULTS, root: Path = ROOT) -> None:
    for page, names in PAGES.items():
        atomic_write_text(root / page, render((root / page).read_text(), results, names))
    pairs = ratios(results)
    if pairs:
        plot(pairs, ASSETS / "ratios.png")

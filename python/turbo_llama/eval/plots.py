"""niah.png, kld.png, bench.png (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402


def niah_png(results: dict, path: Path) -> Path | None:
    niah = results.get("niah") or {}
    cells = niah.get("cells") or []
    per_type = results.get("types") or []
    if not cells or not per_type:
        return None
    lengths = sorted({c["length"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    n = len(per_type)
    fig, axes = plt.subplots(1, n, figsize=(max(7.0, 1.2 + n * (0.6 + 0.5 * len(depths))), 0.55 * len(lengths) + 2.2),
                             squeeze=False, sharey=True)
    cmap = ListedColormap(["#d9534f", "#5cb85c"]).with_extremes(bad="#dddddd")
    for ax, t in zip(axes[0], per_type):
        grid = np.full((len(lengths), len(depths)), np.nan)
        found = (results.get("niah_results") or {}).get(t) or {}
        for key, ok in found.items():
            L, d = key.split("@")
            i, j = lengths.index(int(L)), depths.index(float(d))
            grid[i, j] = 1.0 if ok else 0.0
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto", origin="lower")
        score = f"{int(np.nansum(grid))}/{int(np.sum(~np.isnan(grid)))}" if np.any(~np.isnan(grid)) else "n/a"
        ax.set_title(f"{t}  {score}", fontsize=10)
        ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7, rotation=90 if len(depths) > 5 else 0)
        ax.set_yticks(range(len(lengths)), [f"{L // 1024}K" if L % 1024 == 0 else str(L) for L in lengths], fontsize=8)
        ax.set_xlabel("needle depth", fontsize=8)
        for i in range(len(lengths)):
            for j in range(len(depths)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, "✓" if grid[i, j] else "✗", ha="center", va="center", fontsize=9, color="white")
    axes[0][0].set_ylabel("context length (tokens)")
    fig.suptitle(f"Needle in a haystack, {Path(results.get('model', {}).get('path', '')).name}\n"
                 "green: key recovered, red: missed, grey: not run", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def kld_frontier(points: list[tuple[str, float, float]]) -> list[str]:
    """The caches on the frontier: (name, bits, kld) not beaten in KLD by one with no more bits."""
    best, out = float("inf"), []
    for name, bits, kld in sorted(points, key=lambda p: (p[1], p[2])):
        if kld < best:
            best = kld
            out.append(name)
    return out


def kld_png(results: dict, path: Path) -> Path | None:
    """Mean KLD against bits per value for every cache: types as circles, K/V pairs as triangles, the
    frontier (no cache with fewer bits does better) as a line."""
    rows = [(t, r) for t, r in (results.get("ppl") or {}).items()
            if isinstance(r, dict) and r.get("kld_mean") is not None and r.get("bits_per_value")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.6))
    xs = [r["bits_per_value"] for _, r in rows]
    ys = [max(r["kld_mean"], 1e-7) for _, r in rows]
    front = kld_frontier([(t, x, y) for (t, _), x, y in zip(rows, xs, ys)])
    pts = sorted((x, y) for (t, _), x, y in zip(rows, xs, ys) if t in front)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], color="#5cb85c", lw=1.2, zorder=1, label="frontier")
    for kind, marker in (("type", "o"), ("K/V pair", "^")):
        sel = [(x, y) for (t, _), x, y in zip(rows, xs, ys) if ("/" in t) == (kind == "K/V pair")]
        if sel:
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], s=40, marker=marker, zorder=3, label=kind)
    for (t, r), x, y in zip(rows, xs, ys):
        ax.annotate(t, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
        if r.get("kld_mean_err"):
            ax.errorbar([x], [y], yerr=[[min(r["kld_mean_err"], y * 0.9)], [r["kld_mean_err"]]], fmt="none",
                        color="gray", lw=1, zorder=2)
    ax.set_yscale("log")
    ax.set_xlabel("bits per stored value (mean of K and V)")
    ax.set_ylabel("mean KL divergence vs f16 cache")
    ax.set_title(f"KV-cache memory vs quality, {Path(results.get('model', {}).get('path', '')).name} "
                 f"(ctx {results.get('settings', {}).get('ctx')}, {results.get('settings', {}).get('chunks')} chunks)",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlim(0, max(xs) * 1.15)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bench_png(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """rows: dicts with type, test ('pp'/'tg'), depth, tps."""
    if not rows:
        return None
    tests = [t for t in ("pp", "tg") if any(r["test"] == t for r in rows)]
    fig, axes = plt.subplots(1, len(tests), figsize=(5.5 * len(tests), 4), squeeze=False)
    for ax, test in zip(axes[0], tests):
        for ctype in dict.fromkeys(r["type"] for r in rows):
            pts = sorted((r["depth"], r["tps"]) for r in rows if r["type"] == ctype and r["test"] == test)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=ctype)
        label = next((r.get("label") for r in rows if r["test"] == test and r.get("label")), test)
        ax.set_title(label)
        ax.set_xlabel("context depth (tokens)")
        ax.set_ylabel("tokens / s")
        depths = sorted({r["depth"] for r in rows})
        if len(depths) > 2 and depths[-1] > 8 * max(1, depths[1]):
            ax.set_xscale("symlog", linthresh=max(1, depths[1]))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

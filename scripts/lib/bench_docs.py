"""Renders the generated blocks of docs/benchmarks.md and README.md from
the outputs scripts/bench-docs.sh keeps (DIR/NAME.txt and DIR/NAME.meta).

    python3 scripts/lib/bench_docs.py DIR FILE...

A block is the text between `<!-- bench:NAME begin ... -->` and
`<!-- bench:NAME end -->`; it is replaced only when DIR/NAME.txt exists (the
README's block `readme` renders from nri-beside). Nothing else in a file is
touched.
"""

import os
import re
import sys

BEGIN = re.compile(r"<!-- bench:([a-z0-9-]+) begin[^>]*-->")

# cargo's own lines, not the benchmark's
NOISE = re.compile(
    r"^\s*(Compiling|Finished|Running|Blocking|Updating|Downloaded|Downloading|warning: |Executable|Fresh)\b"
    r"|^go-stub: |^=== "
)


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def meta_lines(d, name):
    meta = read(os.path.join(d, name + ".meta")) or ""
    return dict(
        line.split(": ", 1) for line in meta.splitlines() if ": " in line
    ), meta


def provenance(d, name, command=None):
    """One line: the command, the commit and the machine's load."""
    m, raw = meta_lines(d, name)
    loads = [l.split(": ", 1)[1] for l in raw.splitlines() if l.startswith("load: ")]
    cmd = command or m.get("command", "?")
    parts = [f"`{cmd}`", f"commit {m.get('commit', '?')}", m.get("machine", "?")]
    if loads:
        parts.append("load average " + ", then ".join(loads))
    return "Made by " + "; ".join(parts) + "."


def tables(text):
    """The markdown tables of an output, each a list of rows (cells)."""
    out, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cur.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def roundtrip_table(text):
    """The summary table nri_roundtrip prints last, as markdown lines."""
    lines, keep = [], False
    for line in text.splitlines():
        if line.startswith("median over"):
            keep, lines = True, []
            continue
        if keep:
            if line.startswith("|"):
                lines.append(line)
            elif lines:
                keep = False
    return lines


def rows_of(table_lines):
    return {
        r[0]: r[1:]
        for r in ([c.strip() for c in l.strip().strip("|").split("|")] for l in table_lines)
        if r and r[0] not in ("", "---")
    }


def first_number(cell):
    m = re.search(r"[0-9]+(?:\.[0-9]+)?", cell or "")
    return float(m.group()) if m else None


def header_of(text):
    keep = ("NRI round trip:", "workload:", "placement:", "cgroup tree:", "Go stub column missing")
    return [l for l in text.splitlines() if l.startswith(keep)]


def render_roundtrip(d, name, command=None):
    text = read(os.path.join(d, name + ".txt"))
    table = roundtrip_table(text)
    if not table:
        return None
    head = header_of(text)
    out = [provenance(d, name, command), ""]
    out += ["```text"] + head + ["```", ""] if head else []
    out += table
    return out


def render_readme(d):
    text = read(os.path.join(d, "nri-beside.txt"))
    table = roundtrip_table(text or "")
    if not table:
        return None
    m, raw = meta_lines(d, "nri-beside")
    loads = [l.split(": ", 1)[1] for l in raw.splitlines() if l.startswith("load: ")]
    return table + [
        "",
        f"Medians of the rounds (range in brackets); ratios of medians of the same run. "
        f"Commit {m.get('commit', '?')}, {m.get('machine', '?')}"
        + (f", load average {loads[0]}" if loads else "")
        + ". The absolute figures move with the host; the ratios of one run are what compare.",
    ]


def render_placements(d):
    """One row per placement from the three nri-* outputs."""
    rows = []
    for p in ("beside", "across", "free"):
        text = read(os.path.join(d, f"nri-{p}.txt"))
        if not text:
            continue
        r = rows_of(roundtrip_table(text))
        p50 = r.get("CreateContainer round trip p50")
        p99 = r.get("p99")
        cpu = r.get("CPU per 1,000 creates (floor: its echo process)")
        sync = next((v for k, v in r.items() if k.startswith("Synchronize")), None)
        if not (p50 and p99 and cpu):
            continue
        go_sync = re.sub(r" \(its handler[^)]*\)", "", sync[1]) if sync else "—"
        rows.append(
            f"| {p} | {p50[0]} | {p50[1]} | {p50[2]} | {p50[4]} | {p50[3]} | {p99[4]} "
            f"| {cpu[0]} / {cpu[2]} / {cpu[1]} | {cpu[3]} | {sync[0] if sync else '—'} / {go_sync} |"
        )
    if not rows:
        return None
    return [
        "| `NRI_BENCH_PLACEMENT` | nri-qos p50 | Go stub p50 | floor p50 | nri-qos ÷ floor, p50 "
        "| Go stub ÷ nri-qos, p50 | nri-qos ÷ floor, p99 | CPU per 1,000 creates: nri-qos / floor's echo / Go stub "
        "| Go stub ÷ nri-qos, CPU | Synchronize, nri-qos / Go stub |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ] + rows


def variants(text):
    """`### variant: X` sections of an output, each with its summary table."""
    out, name, buf = [], None, []
    for line in text.splitlines() + ["### variant: end"]:
        if line.startswith("### variant: "):
            if name is not None:
                out.append((name, rows_of(roundtrip_table("\n".join(buf)))))
            name, buf = line[len("### variant: "):], []
        else:
            buf.append(line)
    return out


def render_variants(d, name, columns):
    text = read(os.path.join(d, name + ".txt"))
    vs = variants(text)
    if not vs:
        return None
    head = "| | " + " | ".join(c for c, _ in columns) + " |"
    out = [provenance(d, name), "", head, "|---" * (len(columns) + 1) + "|"]
    for v, r in vs:
        cells = []
        for _, pick in columns:
            cells.append(pick(r) or "—")
        out.append(f"| {v} | " + " | ".join(cells) + " |")
    return out


def cell(r, prefix, i=0):
    for k, v in r.items():
        if k.startswith(prefix):
            return v[i] if i < len(v) else None
    return None


def render_text(d, name, keep=None):
    text = read(os.path.join(d, name + ".txt"))
    if "\ne2e summary:" in "\n" + text:
        # A VM benchmark: its report follows the harness's summary.
        text = text[text.rindex("e2e summary:"):].split("\n", 1)[1]
        text = "\n".join(l for l in text.splitlines() if not re.match(r"  (PASS|FAIL|SKIP) ", l))
    lines = [l.rstrip() for l in text.splitlines() if not NOISE.search(l)]
    if keep:
        lines = [l for l in lines if keep.search(l)]
    while lines and not lines[0]:
        lines.pop(0)
    # no runs of blank lines
    squeezed = []
    for l in lines:
        if l or (squeezed and squeezed[-1]):
            squeezed.append(l)
    if not squeezed:
        return None
    return [provenance(d, name), "", "```text"] + squeezed + ["```"]


SYNC_COLUMNS = [
    ("Synchronize 1k pods / 3k containers", lambda r: cell(r, "Synchronize")),
    ("CreateContainer p50", lambda r: cell(r, "CreateContainer round trip p50")),
    ("RSS idle / after", lambda r: cell(r, "RSS idle")),
    ("peak RSS", lambda r: cell(r, "peak RSS")),
]
NOKUBE_COLUMNS = [
    ("threads / stripped binary", lambda r: cell(r, "threads / stripped binary")),
    ("RSS idle / after", lambda r: cell(r, "RSS idle")),
    ("RssAnon / RssFile after", lambda r: cell(r, "of which anonymous")),
    ("peak RSS", lambda r: cell(r, "peak RSS")),
    ("CreateContainer p50", lambda r: cell(r, "CreateContainer round trip p50")),
    ("Synchronize", lambda r: cell(r, "Synchronize")),
]


def renderer(d, name):
    if not os.path.exists(os.path.join(d, ("nri-beside" if name == "readme" else name) + ".txt")):
        if name != "nri-placements":
            return None
    if name == "readme":
        return render_readme(d)
    if name in ("nri-beside", "nri-across", "nri-free"):
        return render_roundtrip(d, name)
    if name == "nri-placements":
        return render_placements(d)
    if name == "nri-sync":
        return render_variants(d, name, SYNC_COLUMNS)
    if name == "nri-nokube":
        return render_variants(d, name, NOKUBE_COLUMNS)
    if name == "wire-bounds":
        return render_text(d, name, re.compile(r"peak|answered|^test result|^test "))
    return render_text(d, name)


def render_file(d, path):
    text = read(path)
    out, i, lines, changed = [], 0, text.split("\n"), []
    while i < len(lines):
        line = lines[i]
        m = BEGIN.search(line)
        if not m:
            out.append(line)
            i += 1
            continue
        name = m.group(1)
        end = next(
            (j for j in range(i + 1, len(lines)) if f"<!-- bench:{name} end" in lines[j]),
            None,
        )
        if end is None:
            sys.exit(f"{path}: bench:{name} has no end marker")
        body = renderer(d, name)
        out.append(line)
        if body is None:
            out.extend(lines[i + 1:end])
        else:
            out.extend(body)
            changed.append(name)
        out.append(lines[end])
        i = end + 1
    new = "\n".join(out)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{path}: rendered {', '.join(changed) or 'nothing'}")


def main():
    d = sys.argv[1]
    for path in sys.argv[2:]:
        render_file(d, path)


if __name__ == "__main__":
    main()

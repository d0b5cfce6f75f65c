"""results.md from the results JSON: each figure as median [min-max], berth's ratio to each
peer from the same run, and the issue's targets met or missed."""

BERTH = ("berth", "berth-cxx")  # berth's CLI and its C++ client

TITLES = {
    "cold": "Cold run: new container, `true`, remove",
    "exec_true": "Exec round trip: `true` into a running container",
    "exec_echo": "Exec round trip: `sh -c 'echo hi'` (output checked)",
    "tree_in": "Copy in: the tree",
    "big_in": "Copy in: the large file",
    "tree_out": "Copy out: the tree",
    "big_out": "Copy out: the large file",
    "trial": "Trial: create, 20 execs, 1 MiB in, /etc out, delete",
}

# (workload, peer, the ratio berth must reach or beat, extra absolute limit in ms)
TARGETS = [("cold", "crun", 0.5, None), ("exec_true", "crun", 0.2, None),
           ("trial", "bwrap", 0.4, 30.0)]


def fmt_ms(s):
    if not s:
        return "–"
    def one(x):
        return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"
    return f"{one(s['median_ms'])} [{one(s['min_ms'])}–{one(s['max_ms'])}]"


def median(res, peer):
    r = res.get(peer)
    return r["summary"]["median_ms"] if r and r.get("summary") else None


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "–"


def failure_count(results):
    n = 0
    for res in results["workloads"].values():
        n += sum(r["failures"] for r in res.values())
    n += sum(m["failures"] for m in results.get("memory", {}).values())
    return n


def workload_table(name, res, peers):
    berths = [b for b in BERTH if b in res]
    head = "| runtime | median [min–max] ms | n | failures |" + "".join(
        f" {peers[b]['label']} ÷ it |" for b in berths)
    lines = [head, "|" + "---|" * (4 + len(berths))]
    for peer, r in res.items():
        cells = [peers.get(peer, {}).get("label", peer), fmt_ms(r.get("summary")),
                 str(r["summary"]["n"] if r.get("summary") else 0), str(r["failures"])]
        for b in berths:
            cells.append("" if peer in BERTH else ratio(median(res, b), median(res, peer)))
        lines.append("| " + " | ".join(cells) + " |")
    for peer, r in res.items():
        if r.get("phases"):
            parts = ", ".join(f"{k.replace('_', ' ')} {v['median_ms']:.1f}"
                              for k, v in r["phases"].items() if v)
            lines += ["", f"{peers.get(peer, {}).get('label', peer)}, where a trial's time "
                      f"goes (medians, ms): {parts}."]
    errors = [f"- {peer}: {e}" for peer, r in res.items() for e in r.get("errors", [])[:2]]
    if errors:
        lines += ["", "Failures (first ones):", *errors]
    return lines


def markdown(results):
    peers = results["peers"]
    m = results["machine"]
    out = [f"# berth and its peers ({results['mode']} run)", "",
           "Made by `bench/run-compare`" + (" --quick" if results["mode"] == "quick" else "") +
           " (see bench/README.md). Times in milliseconds, median [min–max] of the samples; "
           "ratios are berth's median over the peer's, from this same run.", "",
           "## Machine", "",
           f"- {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; kernel {m['kernel']}; "
           f"Debian {m['os']}; {m['date']}",
           f"- cgroups: {m['cgroups']}", ""]
    out += ["| runtime | version |", "|---|---|"]
    out += [f"| {p['label']} | {p['version']} |" for p in peers.values()]
    for name, why in results.get("skipped_peers", {}).items():
        out.append(f"| {name} | skipped: {why} |")
    if "copy_data" in results:
        d = results["copy_data"]
        out += ["", f"Copy data: a tree of {d['tree_files']:,} files, "
                f"{d['tree_bytes'] / 1e6:,.0f} MB, and one file of {d['big_bytes'] / 1e6:,.0f} MB."]

    out += ["", "## Targets", "", "| target | berth (CLI) | berth (C++ client) |", "|---|---|---|"]
    w = results["workloads"]
    for workload, peer, limit, abs_ms in TARGETS:
        if workload not in w or peer not in w[workload]:
            continue
        res = w[workload]
        cells = []
        for b in BERTH:
            mb, mp = median(res, b), median(res, peer)
            if mb is None or not mp:
                cells.append("–")
                continue
            ok = mb / mp <= limit and (abs_ms is None or mb <= abs_ms)
            cells.append(f"{mb / mp:.2f}× ({mb:.1f} ms) {'met' if ok else 'MISSED'}")
        label = f"{workload} ≤ {limit}× {peer}" + (f" and ≤ {abs_ms:.0f} ms" if abs_ms else "")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    par = [k for k in w if k.startswith("trials_")]
    for k in par:
        res = w[k]
        cells = []
        for b in BERTH:
            mb, mp = median(res, b), median(res, "bwrap")
            if mb is None or not mp:
                cells.append("–")
                continue
            fails = res[b]["failures"]
            ok = mb / mp <= 0.6 and fails == 0
            cells.append(f"{mb / mp:.2f}×, {fails} failures {'met' if ok else 'MISSED'}")
        out.append(f"| {k.replace('_', ' ')} ≤ 0.6× bwrap, 0 failures | " +
                   " | ".join(cells) + " |")
    mem = results.get("memory", {}).get("berth")
    fresh = results.get("berthd_fresh_rss_kib", {}).get("berthd")
    if mem or fresh:
        # Idle twice: just started, and idle again after every other workload of the run.
        idle = [x / 1024 for x in (fresh, mem and mem["daemon_rss_idle_kib"].get("berthd"))
                if x]
        out.append("| berthd idle RSS ≤ 10 MiB (fresh; after the run's workloads) | " +
                   "; ".join(f"{x:.1f} MiB" for x in idle) +
                   f" {'met' if max(idle) <= 10 else 'MISSED'} | (same daemon) |")

    for name, res in w.items():
        title = TITLES.get(name) or name.replace("_", " ").capitalize()
        out += ["", f"## {title}", "", *workload_table(name, res, peers)]

    if results.get("memory"):
        out += ["", "## Memory and disk", "",
                "Per container: host memory (MemAvailable before and after, caches dropped) "
                "and disk (blocks under the runtime's directories), with N idle containers "
                "that each ran `true`; daemons' RSS idle → with them.", "",
                "| runtime | N | host memory per container | disk per container | "
                "daemon RSS idle → loaded | failures |", "|---|---|---|---|---|---|"]
        for peer, r in results["memory"].items():
            rss = ", ".join(
                f"{d} {r['daemon_rss_idle_kib'][d] / 1024:.1f} → "
                f"{r['daemon_rss_loaded_kib'].get(d, 0) / 1024:.1f} MiB"
                for d in r["daemon_rss_idle_kib"]) or "no daemon"
            out.append(f"| {peers.get(peer, {}).get('label', peer)} | {r['containers']} | "
                       f"{r['host_memory_per_container_kib'] / 1024:.2f} MiB | "
                       f"{r['disk_per_container_bytes'] / 1024:.0f} KiB | {rss} | "
                       f"{r['failures']} |")
    out.append("")
    return "\n".join(out)

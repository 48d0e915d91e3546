# benches/paired.awk — portico against its reference, round by round (POSIX awk; mawk ok).
#
# Within one round of benches/run.sh every target runs at one concurrency back to back, so a
# target and its reference are measured seconds apart, while the host's speed drifts over
# minutes (README "Benchmark": spreads of 8–49 % over rounds). The ratio of two medians mixes
# that drift in; the ratio taken within each round cancels most of it. This prints, for each
# pair and concurrency, the per-round ratios' median, lowest and highest, and in how many
# rounds portico reached the bound the issues set for that path.
#
# Input: one or more run reports (benches/results/latest.md, docs/benchmarks/*.md); it reads
# their "req/s per round" tables, so several reports of the same code pool their rounds:
#   awk -f benches/stats.awk -f benches/paired.awk report1.md report2.md
# A round in which either side of a pair was not measured is skipped.

BEGIN {
    # target, reference, bound (issues 23 and 24; 0: none) — in the order printed. The last
    # rows are the before/after pairs of a BASE_BIN run: a change's effect, round by round.
    npairs = split("portico:nginx:1.0 portico-hyper:nginx-hyper:1.0 portico-py-call:nginx-py-call:1.0 " \
        "portico-log:nginx-log:1.0 portico-log:portico:0.95 portico-tls:nginx-tls:1.0 portico-h2:nginx-h2:0 " \
        "portico-verify:nginx:1.0 portico-legacy:nginx:0.9 portico-agg-call:nginx:0 " \
        "portico-agg:nginx-list:0.5 portico-agg-cache:portico-cache:0.8 " \
        "portico:portico-base:0 portico-verify:portico-verify-base:0 portico-legacy:portico-legacy-base:0 " \
        "portico-agg:portico-agg-base:0 portico-agg-call:portico-agg-call-base:0 " \
        "portico-trace001:portico-trace001-base:0 portico-tls:portico-tls-base:0 portico-h2:portico-h2-base:0 " \
        "portico-log:portico-log-base:0", pairs, " ")
    for (i = 1; i <= npairs; i++) {
        split(pairs[i], f, ":")
        ptarget[i] = f[1]; pref[i] = f[2]; pbound[i] = f[3] + 0
    }
}

FNR == 1 { file++; table = 0 }
/^## req\/s per round/ { table = 1; next }
table && /^## / { table = 0 }
table && /^\| [a-z]/ && !/^\| target / {
    nf = split($0, cell, "|")
    t = cell[2]; c = cell[3]; gsub(/ /, "", t); gsub(/ /, "", c)
    for (r = 4; r < nf; r++) {
        v = cell[r]
        sub(/\(.*/, "", v)              # "(errors)", "(busy N%)" notes
        gsub(/ /, "", v)
        if (v == "" || v == "–") continue
        rps[file, t, c, r - 3] = v + 0
        if (r - 3 > rounds_in[file]) rounds_in[file] = r - 3
        seen_c[c] = 1
    }
}

END {
    nc = 0
    for (c in seen_c) cs[++nc] = c + 0
    for (i = 2; i <= nc; i++) {   # concurrencies in numeric order
        x = cs[i]
        for (j = i - 1; j >= 1 && cs[j] > x; j--) cs[j + 1] = cs[j]
        cs[j + 1] = x
    }
    print "| target | against | c | rounds | median of per-round ratios | lowest | highest | rounds at the bound |"
    print "|---|---|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= npairs; i++) {
        for (j = 1; j <= nc; j++) {
            c = cs[j]; n = 0; at = 0
            for (fi = 1; fi <= file; fi++)
                for (r = 1; r <= rounds_in[fi]; r++) {
                    if (!((fi, ptarget[i], c, r) in rps) || !((fi, pref[i], c, r) in rps)) continue
                    if (rps[fi, pref[i], c, r] <= 0) continue
                    q = rps[fi, ptarget[i], c, r] / rps[fi, pref[i], c, r]
                    ratios[++n] = q
                    if (q >= pbound[i]) at++
                }
            if (n == 0) continue
            lo = ratios[1]; hi = ratios[1]
            for (k = 2; k <= n; k++) { if (ratios[k] < lo) lo = ratios[k]; if (ratios[k] > hi) hi = ratios[k] }
            printf "| %s | %s | %s | %d | %.2f× | %.2f× | %.2f× | %s |\n", ptarget[i], pref[i], c, n, \
                median(ratios, n), lo, hi, (pbound[i] > 0) ? sprintf("%d of %d (≥ %.2f×)", at, n, pbound[i]) : "–"
        }
    }
}

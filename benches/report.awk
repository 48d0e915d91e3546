# benches/report.awk — turns run.sh's raw rounds into the markdown tables (POSIX awk; mawk ok).
#
# Input files, in this order:
#   methods.tsv  target <TAB> method                        (every selected target, in order)
#   na.tsv       target <TAB> reason                        (targets that were not measured)
#   raw.tsv      target method c round rps p50_us p99_us errors requests other% steal%
#                (other% / steal%: CPU used by processes outside the benchmark / steal time, in
#                percent of one CPU over the measurement)
# Variables: -v conc="1 16 64" -v rounds=3 -v busy=10 -v section=main|backends|tls|rounds

function lat(us) {
    if (us < 1000) return sprintf("%d µs", us + 0.5)
    if (us < 10000) return sprintf("%.2f ms", us / 1000)
    return sprintf("%.1f ms", us / 1000)
}

function rate(x) {
    if (x >= 100) return sprintf("%d", x + 0.5)
    return sprintf("%.1f", x)
}

# The baseline a target is compared with: the same kind of target (direct or nginx) sending the
# same MCP method, when it was measured; otherwise the tools/call one, marked with a dagger.
function baseline(kind, method, c,    b) {
    b = (method == "tools/list") ? kind "-list" : kind
    if ((b, c) in med_rps) { dagger = ""; return b }
    if ((kind, c) in med_rps) { dagger = (b == kind) ? "" : "†"; return kind }
    dagger = ""
    return ""
}

function ratio(kind, t, c,    b) {
    b = baseline(kind, method_of[t], c)
    # Targets against another backend compare with that backend's own direct / nginx targets.
    if (t ~ /-hyper$/) { b = kind "-hyper"; dagger = "" }
    else if (t ~ /-log$/) { b = (kind == "nginx") ? "nginx-log" : "direct"; dagger = "" }
    else if (t ~ /-py-call$/) { b = kind "-py-call"; dagger = "" }
    # TLS / h2 targets: × nginx against nginx over the same protocol; × direct against the
    # plain-HTTP ceiling (the backend speaks plain HTTP in every case).
    else if (t ~ /-(tls|h2)(-base)?$/) { b = (kind == "nginx") ? "nginx" substr(t, index(t, "-")) : "direct"; sub(/-base$/, "", b); dagger = "" }
    else if (t ~ /-py/) { b = (kind == "direct" && (("direct-py", c) in med_rps)) ? "direct-py" : ""; dagger = "" }
    if (!((b, c) in med_rps)) b = ""
    if (b == "" || med_rps[b, c] <= 0) return "–"
    return sprintf("%.2f×%s", med_rps[t, c] / med_rps[b, c], dagger)
}

FILENAME == ARGV[1] { order[++ntargets] = $1; method_of[$1] = $2; next }
FILENAME == ARGV[2] { na[$1] = $0; sub(/^[^\t]*\t/, "", na[$1]); next }
{
    t = $1; c = $3
    k = t SUBSEP c
    n[k]++
    rps[k, n[k]] = $5; p50[k, n[k]] = $6; p99[k, n[k]] = $7
    round_rps[k, $4] = $5
    round_err[k, $4] = $8
    round_busy[k, $4] = ($10 + 0 > $11 + 0) ? $10 + 0 : $11 + 0
    if (!(k in host) || round_busy[k, $4] > host[k]) host[k] = round_busy[k, $4]
    errs[k] += $8; reqs[k] += $9
}

END {
    nc = split(conc, cs, " ")
    for (key in n) {
        cnt = n[key]
        for (i = 1; i <= cnt; i++) { v1[i] = rps[key, i]; v2[i] = p50[key, i]; v3[i] = p99[key, i] }
        med_rps[key] = median(v1, cnt); med_p50[key] = median(v2, cnt); med_p99[key] = median(v3, cnt)
        lo = v1[1]; hi = v1[1]
        for (i = 2; i <= cnt; i++) { if (v1[i] < lo) lo = v1[i]; if (v1[i] > hi) hi = v1[i] }
        spread[key] = (med_rps[key] > 0 && cnt > 1) ? sprintf("%.1f%%", 100 * (hi - lo) / med_rps[key]) : "–"
    }
    if (section == "backends") {
        # Pass-through on each backend: portico against nginx, and what each adds to the
        # backend's own p50 (direct), from the same run.
        nb = split("bench hyper py-call log", fams, " ")
        print "| backend | c | portico req/s | nginx req/s | portico × nginx | portico +p50 over direct | nginx +p50 over direct |"
        print "|---|---:|---:|---:|---:|---:|---:|"
        for (f = 1; f <= nb; f++) {
            sfx = (fams[f] == "bench") ? "" : "-" fams[f]
            for (j = 1; j <= nc; j++) {
                c = cs[j]
                p = "portico" sfx; x = "nginx" sfx; d = (sfx == "-log") ? "direct" : "direct" sfx
                if (!((p, c) in med_rps) || !((x, c) in med_rps)) continue
                dp = ((d, c) in med_p50) ? sprintf("%+d µs", med_p50[p, c] - med_p50[d, c]) : "–"
                dx = ((d, c) in med_p50) ? sprintf("%+d µs", med_p50[x, c] - med_p50[d, c]) : "–"
                printf "| %s | %s | %s | %s | %.2f× | %s | %s |\n", (fams[f] == "log") ? "bench, access log on (both)" : fams[f], c, rate(med_rps[p, c]), \
                    rate(med_rps[x, c]), (med_rps[x, c] > 0) ? med_rps[p, c] / med_rps[x, c] : 0, dp, dx
            }
        }
        exit
    }
    if (section == "tls") {
        # portico against nginx over TLS (HTTP/1.1, wrk) and h2 (h2load), and what each costs
        # against the same server's plain-HTTP target in this run.
        print "| protocol | c | portico req/s | nginx req/s | portico × nginx | portico p50 / p99 | nginx p50 / p99 | portico × its plain HTTP | nginx × its plain HTTP |"
        print "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        np = split("tls h2", protos, " ")
        for (f = 1; f <= np; f++) {
            for (j = 1; j <= nc; j++) {
                c = cs[j]
                p = "portico-" protos[f]; x = "nginx-" protos[f]
                hp = (p, c) in med_rps; hx = (x, c) in med_rps
                if (!hp && !hx) continue
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", \
                    (protos[f] == "tls") ? "HTTP/1.1 + TLS (wrk)" : "h2 + TLS (h2load, 1 stream per connection)", c, \
                    hp ? rate(med_rps[p, c]) : "–", hx ? rate(med_rps[x, c]) : "–", \
                    (hp && hx && med_rps[x, c] > 0) ? sprintf("%.2f×", med_rps[p, c] / med_rps[x, c]) : "–", \
                    hp ? lat(med_p50[p, c]) " / " lat(med_p99[p, c]) : "–", \
                    hx ? lat(med_p50[x, c]) " / " lat(med_p99[x, c]) : "–", \
                    (hp && (("portico", c) in med_rps) && med_rps["portico", c] > 0) ? sprintf("%.2f×", med_rps[p, c] / med_rps["portico", c]) : "–", \
                    (hx && (("nginx", c) in med_rps) && med_rps["nginx", c] > 0) ? sprintf("%.2f×", med_rps[x, c] / med_rps["nginx", c]) : "–"
            }
        }
        exit
    }
    if (section == "rounds") {
        hdr = "| target | c |"; sep = "|---|---:|"
        for (r = 1; r <= rounds; r++) { hdr = hdr " round " r " |"; sep = sep "---:|" }
        print hdr; print sep
        for (i = 1; i <= ntargets; i++) {
            t = order[i]
            for (j = 1; j <= nc; j++) {
                c = cs[j]
                if (!((t, c) in n)) continue
                line = "| " t " | " c " |"
                for (r = 1; r <= rounds; r++)
                    line = line " " (((t, c, r) in round_rps) ? rate(round_rps[t, c, r]) \
                        ((round_err[t, c, r] > 0) ? " (errors)" : "") \
                        ((round_busy[t, c, r] >= busy) ? sprintf(" (busy %d%%)", round_busy[t, c, r]) : "") : "–") " |"
                print line
            }
        }
        exit
    }
    print "| target | method | c | req/s | p50 | p99 | × direct | × nginx | spread | errors | host load |"
    print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= ntargets; i++) {
        t = order[i]
        if (t in na) {
            printf "| %s | %s | – | n/a (%s) | | | | | | | |\n", t, method_of[t], na[t]
            continue
        }
        for (j = 1; j <= nc; j++) {
            c = cs[j]
            k = t SUBSEP c
            if (!(k in n)) {
                printf "| %s | %s | %s | n/a (no successful round) | | | | | | | |\n", t, method_of[t], c
                continue
            }
            e = errs[k] + 0
            es = (e == 0) ? "0" : sprintf("**%d (%.2f%%)**", e, reqs[k] > 0 ? 100 * e / reqs[k] : 100)
            hl = (host[k] >= busy) ? sprintf("**%d%%**", host[k]) : sprintf("%d%%", host[k])
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t, method_of[t], c, \
                rate(med_rps[k]), lat(med_p50[k]), lat(med_p99[k]), \
                ratio("direct", t, c), ratio("nginx", t, c), spread[k], es, hl
        }
    }
}

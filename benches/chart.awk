# benches/chart.awk — an SVG chart of run.sh's results: req/s (median of rounds) per target, one
# panel per concurrency. Bars are drawn to the scale of their backend group within the panel
# (the Python SDK server answers ~300 req/s where the Rust backends answer ~100k), so each
# group's direct / nginx / portico bars compare at a glance. direct and nginx targets (the
# references) are drawn grey and blue, portico targets orange. POSIX awk; mawk ok.
#
# Input files, in this order:
#   methods.tsv  target <TAB> method      (every selected target, in report order)
#   raw.tsv      target method c round rps p50_us p99_us errors requests other% steal%
# Variables: -v conc="1 16 64" -v title="..."

function esc(s) { gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); gsub(/>/, "\\&gt;", s); return s }

function human(x) {
    if (x >= 10000) return sprintf("%.1fk", x / 1000)
    if (x >= 100) return sprintf("%d", x + 0.5)
    return sprintf("%.1f", x)
}

function group(t) {
    if (t ~ /-hyper$/) return "hyper"
    if (t ~ /-py-call$/) return "py-call"
    if (t ~ /-py/) return "py-list"
    return "bench"
}

# Rows are separated by backend group and, within the bench group, by protocol (the -tls and -h2
# targets share the bench backend's scale, so their bars compare with plain direct / nginx).
function block(t) {
    if (t ~ /-tls$/) return group(t) " tls"
    if (t ~ /-h2$/) return group(t) " h2"
    return group(t)
}

function colour(t) {
    if (t ~ /^direct/) return "#9e9e9e"
    if (t ~ /^nginx/) return "#3b6fb6"
    return "#e8731a"
}

FILENAME == ARGV[1] { order[++nt] = $1; next }
{
    k = $1 SUBSEP $3
    n[k]++
    v[k, n[k]] = $5
}

END {
    nc = split(conc, cs, " ")
    # Only targets with at least one measurement get a row.
    for (i = 1; i <= nt; i++) {
        t = order[i]
        for (j = 1; j <= nc; j++) if ((t, cs[j]) in n) { rows[++nr] = t; break }
    }
    for (key in n) {
        cnt = n[key]
        for (i = 1; i <= cnt; i++) vals[i] = v[key, i]
        med[key] = median(vals, cnt)
    }
    label_w = 150; bar_w = 230; gap = 30; row_h = 16; top = 56
    panel_w = bar_w + 60
    width = label_w + nc * (panel_w + gap)
    height = top + nr * row_h + 40
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"11\">\n", width, height
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    printf "<text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", esc(title)
    printf "<text x=\"8\" y=\"34\" fill=\"#555\">req/s, median of rounds; bars to the scale of their backend group in each panel. grey: direct (no proxy), blue: nginx, orange: portico</text>\n"
    for (j = 1; j <= nc; j++) {
        c = cs[j]
        x0 = label_w + (j - 1) * (panel_w + gap)
        split("", max)
        for (r = 1; r <= nr; r++) {
            g = group(rows[r])
            if ((rows[r], c) in med && med[rows[r], c] > max[g]) max[g] = med[rows[r], c]
        }
        printf "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">c = %s</text>\n", x0, top - 6, c
        printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", x0, top - 2, x0, top + nr * row_h
        for (r = 1; r <= nr; r++) {
            t = rows[r]
            y = top + (r - 1) * row_h
            if (j == 1) printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", label_w - 8, y + 11, esc(t)
            if (r > 1 && block(t) != block(rows[r - 1]))
                printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", x0, y, x0 + panel_w, y
            if (!((t, c) in med)) continue
            g = group(t)
            w = (max[g] > 0) ? med[t, c] / max[g] * bar_w : 0
            printf "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", x0, y + 2, w, row_h - 4, colour(t)
            printf "<text x=\"%.1f\" y=\"%d\" fill=\"#333\">%s</text>\n", x0 + w + 4, y + 11, human(med[t, c])
        }
    }
    printf "</svg>\n"
}

# benches/stats.awk — helpers shared by report.awk and chart.awk (loaded with -f before them).

function median(vals, n,    i, j, t, a) {
    for (i = 1; i <= n; i++) a[i] = vals[i] + 0
    for (i = 2; i <= n; i++) {
        t = a[i]
        for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]
        a[j + 1] = t
    }
    if (n == 0) return 0
    if (n % 2) return a[(n + 1) / 2]
    return (a[n / 2] + a[n / 2 + 1]) / 2
}

# Helpers shared by benches/run.sh and benches/scale.sh (sourced after their `say`/`die`).

cpu_count() { # "0", "0-1", "0,2-3" -> number of CPUs
    local n=0 part a b
    IFS=, read -ra parts <<<"$1"
    for part in "${parts[@]}"; do
        if [[ $part == *-* ]]; then a=${part%-*} b=${part#*-}; n=$((n + b - a + 1)); else n=$((n + 1)); fi
    done
    echo "$n"
}

alive() { # running, and not a zombie
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n $st && $st != Z ]]
}

last_err() { # a one-line reason from a log file
    tail -n 3 "$1" 2>/dev/null | tr '\n' ' ' | sed 's/\x1b\[[0-9;]*m//g; s/  */ /g' | cut -c1-160
}

USED_PORTS=" "
FREE_PORT=
pick_port() { # sets FREE_PORT to a port nothing listens on (below the ephemeral range)
    local p
    for _ in $(seq 500); do
        p=$((20000 + RANDOM % 12000))
        [[ $USED_PORTS == *" $p "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            USED_PORTS+="$p "; FREE_PORT=$p; return 0
        fi
    done
    die "no free port found"
}

wait_port() { # PORT PID [SECONDS]: until PORT accepts connections; fails if PID dies
    local port=$1 pid=$2 tries=$((${3:-10} * 20))
    while ((tries-- > 0)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        alive "$pid" || return 1
        sleep 0.05
    done
    return 1
}

# The guest's idle polling (cpuidle-haltpoll): how long an idle vCPU polls for work before it
# halts. With 0 (this VM image boots with `haltpoll.guest_halt_poll_ns=0`) every idle vCPU halts
# at once, and waking it again costs tens of µs, which dominates a c=1 round trip (README
# "Latency at c = 1"). HALT_POLL_NS=<ns> sets it for the run (the kernel's own default is
# 200000) and the EXIT trap puts the host's value back; unset, the host is left as it is.
HALT_POLL_FILE=/sys/module/haltpoll/parameters/guest_halt_poll_ns
HALT_POLL_WAS=
halt_poll_now() { cat "$HALT_POLL_FILE" 2>/dev/null || echo "n/a (no cpuidle-haltpoll)"; }
halt_poll_apply() {
    [[ -z ${HALT_POLL_NS:-} ]] && return 0
    [[ $HALT_POLL_NS =~ ^[0-9]+$ ]] || die "HALT_POLL_NS must be a number of nanoseconds"
    [[ -w $HALT_POLL_FILE ]] || die "HALT_POLL_NS: $HALT_POLL_FILE is not writable here"
    HALT_POLL_WAS=$(cat "$HALT_POLL_FILE")
    echo "$HALT_POLL_NS" >"$HALT_POLL_FILE" || die "HALT_POLL_NS: could not write $HALT_POLL_FILE"
}
halt_poll_restore() {
    [[ -n $HALT_POLL_WAS ]] && echo "$HALT_POLL_WAS" >"$HALT_POLL_FILE" 2>/dev/null
    HALT_POLL_WAS=
    return 0
}

status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null; }

# The EXIT trap of run.sh and scale.sh: stops everything in ALL_PIDS (TERM, then KILL after 5 s),
# puts the host's halt polling back (HALT_POLL_NS), removes $TMP unless KEEP_TMP=1, and exits
# with the script's status. A script that must stop something its own way first (nginx's
# graceful quit) defines before_cleanup.
cleanup() {
    local rc=$? pid any
    trap - EXIT INT TERM
    set +e
    declare -F before_cleanup >/dev/null && before_cleanup
    for pid in "${ALL_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for _ in $(seq 50); do
        any=0
        for pid in "${ALL_PIDS[@]}"; do alive "$pid" && any=1; done
        ((any)) || break
        sleep 0.1
    done
    for pid in "${ALL_PIDS[@]}"; do alive "$pid" && kill -KILL "$pid" 2>/dev/null; done
    wait 2>/dev/null
    halt_poll_restore
    if [[ $KEEP_TMP == 1 ]]; then say "kept configs and logs in $TMP"; else rm -rf "$TMP"; fi
    exit "$rc"
}

install_cleanup() {
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

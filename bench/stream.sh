#!/usr/bin/env bash
# Streaming (SSE) latency: what the llmgw gateway adds to time to first
# token and to every chunk, against bare nginx proxy_pass
# (proxy_buffering off) in front of the same paced upstream, in one run.
#
#   bench/stream.sh
#
# Starts, all on 127.0.0.1 and all stopped on exit:
#   upstream  bench/lib/sse-upstream.mjs: per request CHUNKS chat.completion
#             chunks INTERVAL_MS apart, a final usage chunk, [DONE]; every
#             chunk carries its send time (hrtime, CLOCK_MONOTONIC)
#   bare      stock nginx, worker_processes auto, proxy_pass with upstream
#             keepalive 64, HTTP/1.1, proxy_buffering off
#   gateway   nginx + llmgw, worker_processes auto, private PostgreSQL,
#             one user and key, a channel to the upstream, pricing, a rate
#             limit (so the limiter runs)
# Then per round STREAMS concurrent streaming requests from
# bench/lib/stream-client.mjs (one process; per target one keep-alive
# http.Agent with maxSockets STREAMS) against
# direct (the upstream itself: the floor of this measurement), bare and
# gateway; a warm-up first, ROUNDS rounds.  Prints p50/p99 of the added TTFT
# (TTFT minus the upstream's own time to its first chunk) and of the added
# per-chunk delay (arrival - upstream send) per target, the gateway - bare
# difference, and whether every stream got every chunk and [DONE].
#
# Env: STREAMS (500)  ROUNDS (3)  CHUNKS (20)  INTERVAL_MS (50)
#      WARMUP_STREAMS (STREAMS: opens every client connection)
#      STAGGER_MS (500): request starts are spread evenly over this time, so
#        all STREAMS are open together for the second half of each stream
#        (1000 ms at the defaults); 50 makes it a burst of 10 starts per ms,
#        which on 2 cores measures the queue of the burst, not the proxies
#      OTHER_MAX (10) RETRIES (2): a round during which more than OTHER_MAX %
#        of the CPU went to processes that are not the benchmark's or to the
#        hypervisor (steal) is run again, at most RETRIES times, keeping the
#        quietest attempt
#      MODEL (bench-stream)  BENCH_KEEP=1
# A benchmark, not a test: it fails only if something did not run or a
# stream stalled.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

STREAMS=${STREAMS:-500}
ROUNDS=${ROUNDS:-3}
CHUNKS=${CHUNKS:-20}
INTERVAL_MS=${INTERVAL_MS:-50}
MODEL=${MODEL:-bench-stream}
case "$STREAMS$ROUNDS$CHUNKS$INTERVAL_MS" in *[!0-9]*) die "STREAMS, ROUNDS, CHUNKS, INTERVAL_MS must be numbers" ;; esac
[ "$STREAMS" -ge 1 ] && [ "$STREAMS" -le 4000 ] || die "STREAMS must be 1..4000"
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] || die "ROUNDS must be 1..20"
[ "$CHUNKS" -ge 2 ] && [ "$CHUNKS" -le 1000 ] || die "CHUNKS must be 2..1000"
[ "$INTERVAL_MS" -le 1000 ] || die "INTERVAL_MS above 1000"
WARM=${WARMUP_STREAMS:-$STREAMS}
STAGGER_MS=${STAGGER_MS:-500}
OTHER_MAX=${OTHER_MAX:-10}
RETRIES=${RETRIES:-2}
case "$OTHER_MAX$RETRIES$STAGGER_MS$WARM" in *[!0-9]*) die "OTHER_MAX, RETRIES, STAGGER_MS, WARMUP_STREAMS must be whole numbers" ;; esac
[ "$RETRIES" -le 5 ] || die "RETRIES above 5"
[ "$WARM" -le 4000 ] || die "WARMUP_STREAMS above 4000"
[ "$STAGGER_MS" -le 60000 ] || die "STAGGER_MS above 60000"
# Every run of the client ends by this time (ms), finished or not.
TIMEOUT_MS=$(( CHUNKS * INTERVAL_MS + 20000 ))

bench_init stream
OUT=$BENCH_RUN/streams
mkdir -p "$OUT"

P_UP=$(free_port)
P_BARE=$(free_port)
P_GW=$(free_port)
while [ "$P_BARE" = "$P_UP" ]; do P_BARE=$(free_port); done
while [ "$P_GW" = "$P_UP" ] || [ "$P_GW" = "$P_BARE" ]; do P_GW=$(free_port); done

start_pg
start_node "$BENCH_RUN/sse-upstream.log" "$SCRIPT_DIR/lib/sse-upstream.mjs" "$P_UP" "$CHUNKS" "$INTERVAL_MS"
wait_port "$P_UP" "$NODE_PID" || { cat "$BENCH_RUN/sse-upstream.log" >&2; die "SSE upstream did not start"; }
CPU_ROOTS+=("upstream=$NODE_PID")
log "SSE upstream: node pid $NODE_PID on 127.0.0.1:$P_UP ($CHUNKS chunks, $INTERVAL_MS ms apart)"
start_bare "$P_BARE" "$P_UP" "proxy_buffering off;"
start_gateway "$P_GW"
GW_URL=http://127.0.0.1:$P_GW

KEY=$(admin setup --upstream "http://127.0.0.1:$P_UP" --model "$MODEL" \
    --users 1 --rl-total 100000 --probe stream)
log "gateway provisioned: 1 user/key, channel -> SSE upstream"

# Ledger baseline once the setup probes' rows are written (1 s batches).
ledger_settled() {
    local a b
    a=$(admin log-total --model "$MODEL")
    for _ in $(seq 1 20); do
        sleep 1.2
        b=$(admin log-total --model "$MODEL")
        [ "$a" = "$b" ] && break
        a=$b
    done
    echo "$a"
}
LEDGER0=$(ledger_settled)

log "client: warm-up $WARM streams per target, then $ROUNDS rounds of $STREAMS streams: direct, bare, gateway"
# Bounded: 1 + ROUNDS * (1 + RETRIES) batches per target, each at most
# TIMEOUT_MS.
timeout -k 5 $(( (1 + ROUNDS * (1 + RETRIES)) * 3 * (TIMEOUT_MS / 1000 + 2) + 30 )) \
    node "$SCRIPT_DIR/lib/stream-client.mjs" run \
    --targets "direct=http://127.0.0.1:$P_UP,bare=http://127.0.0.1:$P_BARE,gateway=$GW_URL" \
    --keyed gateway --key "$KEY" --other-max "$OTHER_MAX" --retries "$RETRIES" --n "$STREAMS" --rounds "$ROUNDS" --warmup "$WARM" \
    --model "$MODEL" --chunks "$CHUNKS" --stagger-ms "$STAGGER_MS" --timeout-ms "$TIMEOUT_MS" \
    --cpu-roots "$(IFS=,; echo "${CPU_ROOTS[*]}"),pg=$(pg_pid),load=$$" --dir "$OUT" 2>&1 | tee "$BENCH_RUN/client.log" | sed 's/^/bench:   /' >&2 \
    || die "stream client failed (log: $BENCH_RUN/client.log)"

gw_streams=$(( WARM + $(node -e "console.log(require('$OUT/totals.json').gateway || 0)") ))
LEDGER1=$LEDGER0
for _ in $(seq 1 20); do
    LEDGER1=$(admin log-total --model "$MODEL")
    [ "$LEDGER1" -ge $(( LEDGER0 + gw_streams )) ] && break
    sleep 1
done

# ---------------------------------------------------------------- report
echo
echo "llmgw stream benchmark  $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(machine_line)"
echo "load: $STREAMS concurrent streams per round (started over $STAGGER_MS ms, on kept-alive client connections), $CHUNKS chunks $INTERVAL_MS ms apart + usage + [DONE], $ROUNDS rounds of direct / bare / gateway"
echo "TTFT+  = time to first chunk minus the upstream's own time to send it"
echo "chunk+ = chunk arrival minus its upstream send time (chunks 2..last)"
echo
rc=0
node "$SCRIPT_DIR/lib/stream-client.mjs" report --targets direct,bare,gateway \
    --base bare --gw gateway "$OUT"/direct-r*.json "$OUT"/bare-r*.json "$OUT"/gateway-r*.json || rc=$?
echo "ledger: GET /api/log total +$(( LEDGER1 - LEDGER0 )) for $gw_streams gateway streams (warm-up and retries included)" \
    "($([ $(( LEDGER1 - LEDGER0 )) -ge "$gw_streams" ] && echo ok || echo FEWER))"
echo "$(gw_log_summary)"
[ "$rc" -eq 0 ] || die "some streams stalled (samples in $OUT)"
BENCH_OK=1

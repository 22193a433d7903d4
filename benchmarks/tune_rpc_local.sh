#!/usr/bin/env bash
# Measure the candidates built into DIR (`mxgemm tune --build-only DIR`) twice on this box and time both:
# through a TVM RPC tracker and one `mxgemm rpc-server` started here on localhost (`mxgemm tune --rpc`),
# and directly (`mxgemm tune --measure`, the manual split's measuring step). Tables and merged logs go to
# OUT. Usage: benchmarks/tune_rpc_local.sh DIR KEY OUT (RPC_ONLY=1: only through RPC)
set -euo pipefail
dir=$1 key=$2 out=$3
mkdir -p "$out"
port=9190
python -m tvm.exec.rpc_tracker --host 127.0.0.1 --port $port --port-end $((port + 1)) > "$out/tracker.log" 2>&1 &
tracker=$!
sleep 2
setsid python -m mxgemm.cli rpc-server --tracker 127.0.0.1:$port --key "$key" --host 127.0.0.1 \
    --port 9300 --port-end 9310 > "$out/server.log" 2>&1 &
server=$!
trap 'kill -9 -- -$server $tracker 2>/dev/null || true' EXIT
for _ in $(seq 60); do grep -q "bind to" "$out/server.log" && break; sleep 1; done
sleep 3  # the server's first report to the tracker
t0=$(date +%s.%N)
python -m mxgemm.cli tune --measure "$dir" --rpc 127.0.0.1:$port --rpc-key "$key" --table "$out/rpc.md"
t1=$(date +%s.%N)
cp "$dir/tune_measurements.jsonl" "$out/rpc_measurements.jsonl"
if [ "${RPC_ONLY:-0}" = 1 ]; then
    python -c "import sys; print(f'measure through RPC: {float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$t0" "$t1" | tee "$out/wall.txt"
    exit 0
fi
python -m mxgemm.cli tune --measure "$dir" --table "$out/local.md"
t2=$(date +%s.%N)
cp "$dir/tune_measurements.jsonl" "$out/local_measurements.jsonl"
python - "$t0" "$t1" "$t2" <<'PY' | tee "$out/wall.txt"
import sys
t0, t1, t2 = map(float, sys.argv[1:])
print(f"measure through RPC: {t1 - t0:.1f} s; measure directly (--measure): {t2 - t1:.1f} s")
PY

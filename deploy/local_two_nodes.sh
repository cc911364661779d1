#!/usr/bin/env bash
# Runs a program the way deploy/torchx/epcomm.py launches it on EKS (torchrun,
# one agent per node, static rendezvous at node 0), as two virtual nodes of
# PER_NODE ranks on this host, every fabric bound to loopback:
#
#   deploy/local_two_nodes.sh PROGRAM [ARGS...]
#
# PER_NODE (default 2), PYTHON (default /usr/bin/python3, whose torch provides
# torchrun) and TIMEOUT_S (default 120) may be set. Exits non-zero when any
# rank does; each rank's output is printed, prefixed by its node and rank.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 PROGRAM [ARGS...]" >&2; exit 2; }
per_node=${PER_NODE:-2}
python=${PYTHON:-/usr/bin/python3}
limit=${TIMEOUT_S:-120}
# torchrun's store takes the port, epcomm's rendezvous the next one.
port=$("$python" - <<'PY'
import socket
while True:
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError:
        pass
    finally:
        a.close(); b.close()
PY
)
# torch 1.13 under Python 3.11 cannot parse the default "0" of --redirects and
# --tee, nor "3" (iterating an IntFlag skips NONE and ALL): a per-rank mapping of
# single streams works (stdout to the log files, stderr to both).
map() { local v=$1 m="" r; for ((r = 0; r < per_node; ++r)); do m+="${m:+,}$r:$v"; done; echo "$m"; }
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
export FI_PROVIDER="tcp;ofi_rxm" FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
pids=()
for node in 0 1; do
  timeout "$limit" "$python" -m torch.distributed.run \
    --nnodes 2 --node_rank "$node" --nproc_per_node "$per_node" \
    --rdzv_backend static --master_addr 127.0.0.1 --master_port "$port" \
    --rdzv_id "epcomm-local-$$" --max_restarts 0 \
    --redirects "$(map 1)" --tee "$(map 2)" --log_dir "$logs/node$node" \
    --no_python "$@" > "$logs/agent$node.txt" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for node in 0 1; do
  for out in "$logs/node$node"/*/attempt_0/*/stdout.log; do
    rank=$(basename "$(dirname "$out")")
    sed "s/^/[node $node rank $rank] /" "$out"
  done
done
[ $status -eq 0 ] || { echo "local_two_nodes: a rank failed; torchrun said:" >&2; cat "$logs"/agent*.txt >&2; }
exit $status

# Shared by the cluster launchers (examples/npu/*.sh, examples/cuda/*.sh); sourced, not run.
# Expects MASTER_ADDR, RAY_PORT, SOCKET_IFNAME, JOIN_TIMEOUT_S and PYTHON to be set.
# Nothing here kills or force-stops anything: an existing Ray on a node is an error to resolve.

log() { echo "[$(date +%H:%M:%S) $(hostname)] $*"; }

current_ip() {  # this node's IP on the route to the head (or on SOCKET_IFNAME)
  if [ "$MASTER_ADDR" = "127.0.0.1" ]; then echo 127.0.0.1; return; fi
  if [ -n "$SOCKET_IFNAME" ]; then
    ip -4 -o addr show "$SOCKET_IFNAME" | awk '{print $4}' | cut -d/ -f1 | head -n1
  else
    ip -4 route get "$MASTER_ADDR" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}' | head -n1
  fi
}

cluster_resource() {  # $1: a Ray resource name (GPU, NPU); how many the cluster has (0 if unreachable)
  "$PYTHON" - "$MASTER_ADDR:$RAY_PORT" "$1" <<'PY' 2>/dev/null || echo 0
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(int(ray.cluster_resources().get(sys.argv[2], 0)))
PY
}

refuse_running_ray() {
  if ray status >/dev/null 2>&1; then
    log "a Ray runtime is already running on this node; stop it yourself (ray stop) if it is yours, then rerun"
    exit 1
  fi
}

start_head_and_wait() {  # $1: resource, $2: how many must join, then `ray start` flags
  local res="$1" want="$2" waited=0 have
  shift 2
  log "head: starting Ray on $MASTER_ADDR:$RAY_PORT"
  ray start --head --port="$RAY_PORT" "$@"
  while :; do
    have="$(cluster_resource "$res")"
    [ "$have" -ge "$want" ] && break
    if [ "$waited" -ge "$JOIN_TIMEOUT_S" ]; then
      log "only $have of $want ${res}s joined after ${JOIN_TIMEOUT_S}s; check the worker nodes' logs"
      exit 1
    fi
    log "waiting for nodes: $have/$want ${res}s"
    sleep 10
    waited=$((waited + 10))
  done
  log "all nodes joined ($want ${res}s)"
}

join_head() {  # `ray start` flags; retries until the head answers or JOIN_TIMEOUT_S passes
  local waited=0
  log "worker: joining $MASTER_ADDR:$RAY_PORT"
  until ray start --address="$MASTER_ADDR:$RAY_PORT" "$@"; do
    if [ "$waited" -ge "$JOIN_TIMEOUT_S" ]; then
      log "could not join the head after ${JOIN_TIMEOUT_S}s"
      exit 1
    fi
    sleep 10
    waited=$((waited + 10))
  done
  log "joined; this node now runs the head's Ray workers (ray stop on this node to leave)"
}

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

# --- who can reach the cluster -------------------------------------------------------------
# Ray's dashboard (and its job API: anyone who reaches it can run code on every node) listens on
# DASHBOARD_HOST. Ray >= 2.52 has token authentication: every node, the driver and every API
# client must present the same token, read from RAY_AUTH_TOKEN_PATH (a file only its owner may
# read). Older Ray has none: the dashboard is then bound to 127.0.0.1 (reach it via ssh -L).

ray_has_token_auth() {  # exit 0 when the installed Ray supports RAY_AUTH_MODE=token (>= 2.52)
  "$PYTHON" - <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
major, minor = (int(x) for x in version("ray").split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 52) else 1)
PY
}

token_file_ok() {  # $1: path; a non-empty regular file owned by us that nobody else can read or write
  local f="$1" mode owner
  [ -f "$f" ] && [ -s "$f" ] || return 1
  mode="$(stat -c %a "$f")"; owner="$(stat -c %u "$f")"
  [ "$owner" = "$(id -u)" ] && [ "${mode: -2}" = "00" ]
}

setup_ray_auth() {  # $1: head|worker, $2: this node's IP. Sets DASHBOARD_HOST; exports the auth variables.
  local role="$1" ip="$2"
  RAY_AUTH_TOKEN_PATH="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/asp_auth_token}"
  if ray_has_token_auth; then
    if [ ! -e "$RAY_AUTH_TOKEN_PATH" ] && [ "$role" = head ]; then
      (umask 077; mkdir -p "$(dirname "$RAY_AUTH_TOKEN_PATH")"
       "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$RAY_AUTH_TOKEN_PATH")
      log "generated a Ray auth token in $RAY_AUTH_TOKEN_PATH; copy it to the same path on every node (mode 600)"
    fi
    if ! token_file_ok "$RAY_AUTH_TOKEN_PATH"; then
      log "Ray token authentication needs $RAY_AUTH_TOKEN_PATH: a non-empty file you own with mode 600"
      log "(copy the head's token there: scp head:$RAY_AUTH_TOKEN_PATH ... && chmod 600 ...)"
      exit 1
    fi
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH
    DASHBOARD_HOST="${DASHBOARD_HOST:-$ip}"
    log "Ray token authentication on (token in $RAY_AUTH_TOKEN_PATH); dashboard on $DASHBOARD_HOST"
  else
    unset RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH
    DASHBOARD_HOST=127.0.0.1
    log "this Ray has no token authentication (needs >= 2.52): dashboard and job API bound to 127.0.0.1 only"
  fi
}

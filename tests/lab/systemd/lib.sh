# Helpers of the lab checks on a node booted by systemd (tests/lab/systemd/node.sh, reboot.sh):
# the installed blkfencectl for node A (the installed unit's socket) and node B (a transient unit's),
# systemd's view of a unit, the journal, the fields of a resource's status, and the configuration of
# resource db. Sourced after tests/lab/lib/guest.sh.

# The installed product: the Debian package puts it under /usr, `cmake --install` under the
# build's prefix (/usr/local); the unit's ExecStart= names it either way.
sbin=/usr/local/sbin
[[ -n ${BLKFENCE_LAB_DEB:-} ]] && sbin=/usr/sbin
ctl=$sbin/blkfencectl
a_ctl() { "$ctl" "$@"; }
b_ctl() { BLKFENCE_SOCKET=/run/blkfence-b/control.sock "$ctl" "$@"; }

# sd_prop UNIT PROPERTY: one property of a unit, as `systemctl show` gives it.
sd_prop() { systemctl show -P "$2" "$1"; }

# sd_props UNIT PROPERTY...: "NAME=VALUE ..." of several properties, in the order given, from one
# `systemctl show` (each costs a second under TCG: an inactive unit is unloaded, and loading it
# again reads the unit directories over 9p).
sd_props() {
  local unit=$1 out line
  local -A value=()
  shift
  out=$(systemctl show "${@/#/--property=}" "$unit") || return 1
  while IFS= read -r line; do value[${line%%=*}]=${line#*=}; done <<<"$out"
  out=""
  for line in "$@"; do out+="$line=${value[$line]-} "; done
  printf '%s\n' "${out% }"
}

# sd_await UNIT PROPERTY VALUE [SECONDS]: waits (30 s by default) until PROPERTY is VALUE.
sd_await() {
  local unit=$1 prop=$2 want=$3 until=$((SECONDS + ${4:-30})) got=""
  while ((SECONDS < until)); do
    got=$(sd_prop "$unit" "$prop") && [[ $got == "$want" ]] && return 0
    sleep 0.2
  done
  echo "sd_await: $unit $prop is '$got', not '$want'"
  return 1
}

# journal_cursor: the journal's current end, for journal_since.
journal_cursor() { journalctl -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'; }

# journal_since CURSOR UNIT: UNIT's records (messages only) after CURSOR (all with CURSOR "").
# The state of an inactive unit (its Result, its main process's exit) is forgotten when systemd
# unloads it; the journal keeps what happened.
journal_since() { journalctl ${1:+--after-cursor="$1"} -u "$2" -o cat --no-pager; }

# journal_await CURSOR UNIT TEXT: waits (10 s) until UNIT's records after CURSOR hold TEXT.
# Captured, then matched: under pipefail `journalctl | grep -q` fails when grep exits first.
journal_await() {
  local until=$((SECONDS + 10)) records
  while ((SECONDS < until)); do
    records=$(journal_since "$1" "$2") && [[ $records == *"$3"* ]] && return 0
    sleep 0.2
  done
  echo "journal_await: no '$3' from $2 in the journal"
  return 1
}

# status_field FIELD: FIELD of the first resource of a `blkfencectl status --json` on stdin.
status_field() {
  python3 -c '
import json, sys
status = json.load(sys.stdin)["resources"][0]
value = status.get(sys.argv[1])
print("null" if value is None else (str(value).lower() if isinstance(value, bool) else value))' "$1"
}
# a_field RESOURCE FIELD / b_field: a field of a resource's status on A / B (see bf_field).
a_field() { a_ctl status "$1" --json | status_field "$2"; }
b_field() { b_ctl status "$1" --json | status_field "$2"; }

# config NODE_ID ON_FENCED [TOP-LEVEL LINES]: resource db on the LUs of the script's array lus, by
# node A's or B's own sg paths (in one guest a WWN resolves to both nodes' paths).
config() {
  local id=$1 on_fenced=$2 extra=${3:-} node=A devices="" lu units=""
  ((id == 2)) && node=B
  for lu in "${lus[@]}"; do devices+="\"$(lab_dev "$node" "$lu" sg)\", "; done
  [[ $on_fenced == *-units ]] && units='units = ["lab-writer.service"]'
  cat <<TOML
cluster = "lab"
node_id = $id
$extra

[[resource]]
name = "db"
devices = [${devices%, }]
preempt = "preempt"
check_interval = "500ms"
lease = "3s"
command_timeout = "2s"
on_fenced = "$on_fenced"
$units
TOML
}

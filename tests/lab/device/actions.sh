#!/bin/bash
# Proves every service action of 'blkfencectl device' against LIO on one LU, with the effect of each
# checked through sg_persist from the other node's I_T nexus; that a command which gets the unit
# attention a preemption leaves is retried and takes effect; and the documented exit statuses for a
# conflict and for a missing device.
#   usage: actions.sh TRANSPORT LU     (TRANSPORT: uring or sgio)
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
transport=${1:?transport} lu=${2:?lu}
a=$(lab_dev A "$lu") && b=$(lab_dev B "$lu") && a_sg=$(lab_dev A "$lu" sg) || exit 1
ctl() { "$BLKFENCECTL" device "$@" --transport "$transport"; }
ka=0x6c9d0001000000a1 ka2=0x6c9d0001000000a2 ka3=0x6c9d0001000000a3 kb=0x6c9d0002000000b1
we_ro="Write Exclusive, registrants only"
lab_log "LU $lu over $LAB_FABRIC with the $transport transport: A is $a ($a_sg), B is $b"

lab_expect "register A (on the sg node)" ctl register --key "$ka" "$a_sg"
lab_expect "register B (on the sd node)" ctl register --key "$kb" "$b"
lab_expect_eq "sg_persist from B sees both keys" "$(lab_keys "$b" | sort | tr '\n' ' ')" "$ka $kb "
lab_expect "A reserves we-ro" ctl reserve --key "$ka" --type we-ro "$a"
lab_expect_eq "sg_persist from B sees A holding type 5" "$(lab_holder "$b")" "$ka $we_ro"

keys=$(ctl keys "$b")
lab_expect_eq "keys: the table lists both keys" "$(awk 'NR == 2 {print $4, $5}' <<<"$keys")" "$ka $kb"
json=$(ctl keys --json "$b")
lab_expect_eq "keys --json matches sg_persist" \
  "$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["exit"], d["lus"][0]["ok"], *d["lus"][0]["keys"])' <<<"$json")" \
  "0 True $(lab_keys "$b" | tr '\n' ' ' | sed 's/ $//')"
lab_expect_eq "reservation: the table shows A's key and we-ro" \
  "$(ctl reservation "$b" | awk 'NR == 2 {print $4, $5}')" "$ka we-ro"
lab_expect_eq "capabilities include we-ro and ATP_C, as sg_persist -c says" \
  "$(ctl capabilities "$a" | grep -o 'ATP_C\|we-ro' | sort -u | tr '\n' ' ')" "ATP_C we-ro "
status=$(ctl status --json "$b")
lab_expect_eq "status: two registrations, A's the holder, both with TransportIDs" \
  "$(python3 -c 'import json,sys; r=json.load(sys.stdin)["lus"][0]["registrations"]; print(len(r), [x["key"] for x in r if x["holder"]], all(x["transport_id"] != "-" for x in r))' <<<"$status")" \
  "2 ['$ka'] True"

lab_expect "A releases" ctl release --key "$ka" --type we-ro "$a"
lab_expect_eq "sg_persist from B sees no reservation" "$(lab_holder "$b")" "none"
lab_expect_eq "registrations stay after RELEASE" "$(lab_keys "$b" | sort | tr '\n' ' ')" "$ka $kb "
lab_expect "A changes its key with REGISTER --old-key" ctl register --old-key "$ka" --key "$ka2" "$a"
lab_expect_eq "sg_persist from B sees A's new key" "$(lab_keys "$b" | sort | tr '\n' ' ')" "$ka2 $kb "
lab_expect "A reserves again" ctl reserve --key "$ka2" "$a"

conflict_rc=0
ctl reserve --key "$kb" "$b" >/dev/null 2>&1 || conflict_rc=$?
lab_expect_eq "B's RESERVE while A holds exits 4 (conflict)" "$conflict_rc" 4

lab_expect "B preempts A" ctl preempt --key "$kb" --victim "$ka2" "$b"
lab_expect_eq "sg_persist from B sees only B's key" "$(lab_keys "$b" | tr '\n' ' ')" "$kb "
lab_expect_eq "sg_persist from B sees B holding" "$(lab_holder "$b")" "$kb $we_ro"

# A's nexus now has a unit attention pending (2A/05, registrations preempted), so nothing may talk
# through A's nexus before this: A's next command gets the UA instead of executing, and
# blkfencectl must retry it.
attempts=$(ctl register --key "$ka3" --verbose "$a" 2>&1)
rc=$?
lab_expect_eq "A's REGISTER after the preempt succeeds" "$rc" 0
lab_expect_eq "... and it met a unit attention first, which was retried" \
  "$(grep -c 'UNIT ATTENTION' <<<"$attempts")" 1
lab_expect_eq "sg_persist from B sees A's registration took effect" \
  "$(lab_keys "$b" | sort | tr '\n' ' ')" "$ka3 $kb "

if [[ $LAB_FABRIC == iscsi ]]; then  # PREEMPT AND ABORT deadlocks LIO over tcm_loop on 6.1
  lab_expect "B preempts and aborts A" ctl preempt-abort --key "$kb" --victim "$ka3" "$b"
  lab_expect_eq "sg_persist from A sees only B's key" "$(lab_keys "$a" | tr '\n' ' ')" "$kb "
  lab_expect "A registers again" ctl register --key "$ka3" "$a"
fi

lab_expect "A unregisters" ctl unregister "$a"
lab_expect_eq "sg_persist from B sees only B's key" "$(lab_keys "$b" | tr '\n' ' ')" "$kb "
lab_expect "B clears" ctl clear --key "$kb" "$b"
lab_expect_eq "sg_persist from A sees no keys" "$(lab_keys "$a" | tr '\n' ' ')" ""
lab_expect_eq "sg_persist from A sees no reservation" "$(lab_holder "$a")" "none"

missing_rc=0
ctl keys /dev/sdzz >/dev/null 2>&1 || missing_rc=$?
lab_expect_eq "a missing device exits 3" "$missing_rc" 3
lab_done

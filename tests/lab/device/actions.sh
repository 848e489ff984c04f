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
lab_expect_read "sg_persist from B sees both keys" "$ka $kb " lab_keyset "$b"
lab_expect "A reserves we-ro" ctl reserve --key "$ka" --type we-ro "$a"
lab_expect_read "sg_persist from B sees A holding type 5" "$ka $we_ro" lab_holder "$b"

keys=$(ctl keys "$b")
lab_expect_eq "keys: the table lists both keys" "$(awk 'NR == 2 {print $4, $5}' <<<"$keys")" "$ka $kb"
json=$(ctl keys --json "$b")
# In registration order, as both list them; the sg_persist side must be read, not assumed empty.
if sg_keys=$(lab_keys "$b"); then
  lab_expect_eq "keys --json matches sg_persist" \
    "$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["exit"], d["lus"][0]["ok"], *d["lus"][0]["keys"])' <<<"$json")" \
    "0 True ${sg_keys//$'\n'/ }"
else
  lab_not_ok "keys --json matches sg_persist: sg_persist -k $b failed"
fi
lab_expect_eq "reservation: the table shows A's key and we-ro" \
  "$(ctl reservation "$b" | awk 'NR == 2 {print $4, $5}')" "$ka we-ro"
lab_expect_eq "capabilities include we-ro and ATP_C, as sg_persist -c says" \
  "$(ctl capabilities "$a" | grep -o 'ATP_C\|we-ro' | sort -u | tr '\n' ' ')" "ATP_C we-ro "
status=$(ctl status --json "$b")
lab_expect_eq "status: two registrations, A's the holder, both with TransportIDs" \
  "$(python3 -c 'import json,sys; r=json.load(sys.stdin)["lus"][0]["registrations"]; print(len(r), [x["key"] for x in r if x["holder"]], all(x["transport_id"] != "-" for x in r))' <<<"$status")" \
  "2 ['$ka'] True"

lab_expect "A releases" ctl release --key "$ka" --type we-ro "$a"
lab_expect_read "sg_persist from B sees no reservation" none lab_holder "$b"
lab_expect_read "registrations stay after RELEASE" "$ka $kb " lab_keyset "$b"
lab_expect "A changes its key with REGISTER --old-key" ctl register --old-key "$ka" --key "$ka2" "$a"
lab_expect_read "sg_persist from B sees A's new key" "$ka2 $kb " lab_keyset "$b"
lab_expect "A reserves again" ctl reserve --key "$ka2" "$a"

conflict_rc=0
ctl reserve --key "$kb" "$b" >/dev/null 2>&1 || conflict_rc=$?
lab_expect_eq "B's RESERVE while A holds exits 4 (conflict)" "$conflict_rc" 4

lab_expect "B preempts A" ctl preempt --key "$kb" --victim "$ka2" "$b"
lab_expect_read "sg_persist from B sees only B's key" "$kb " lab_keyset "$b"
lab_expect_read "sg_persist from B sees B holding" "$kb $we_ro" lab_holder "$b"

# A's nexus now has a unit attention pending (2A/05, registrations preempted), so nothing may talk
# through A's nexus before this: A's next command gets the UA instead of executing, and
# blkfencectl must retry it.
attempts=$(ctl register --key "$ka3" --verbose "$a" 2>&1)
rc=$?
lab_expect_eq "A's REGISTER after the preempt succeeds" "$rc" 0
lab_expect_eq "... and it met a unit attention first, which was retried" \
  "$(grep -c 'UNIT ATTENTION' <<<"$attempts")" 1
lab_expect_read "sg_persist from B sees A's registration took effect" "$ka3 $kb " lab_keyset "$b"

if [[ $LAB_FABRIC == iscsi ]]; then  # PREEMPT AND ABORT deadlocks LIO over tcm_loop on 6.1
  lab_expect "B preempts and aborts A" ctl preempt-abort --key "$kb" --victim "$ka3" "$b"
  lab_expect_read "sg_persist from A sees only B's key" "$kb " lab_keyset "$a"
  lab_expect "A registers again" ctl register --key "$ka3" "$a"
fi

lab_expect "A unregisters" ctl unregister "$a"
lab_expect_read "sg_persist from B sees only B's key" "$kb " lab_keyset "$b"
lab_expect "B clears" ctl clear --key "$kb" "$b"
lab_expect_read "sg_persist from A sees no keys" "" lab_keyset "$a"
lab_expect_read "sg_persist from A sees no reservation" none lab_holder "$a"

missing_rc=0
ctl keys /dev/sdzz >/dev/null 2>&1 || missing_rc=$?
lab_expect_eq "a missing device exits 3" "$missing_rc" 3
lab_done

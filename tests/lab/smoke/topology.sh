#!/bin/bash
# Proves the lab's map is right: every node sees every LU through its own sd and sg nodes, the
# devices exist, the serial each device reports (VPD 0x80, read with sg_vpd through the sg node) is
# the one the topology configured for that LU, and every node agrees on each LU's WWN while LUs
# differ.
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"

declare -A sd sg wwn
paths=0
while IFS=$'\t' read -r node lu w _ s g _; do
  sd[$node/$lu]=$s sg[$node/$lu]=$g wwn[$node/$lu]=$w
  paths=$((paths + 1))
done < <(tail -n +2 "$BLKFENCE_LAB_MAP")

lab_expect_eq "map has one path per node and LU" "$paths" "$((LAB_NODES * LAB_LUNS))"
lab_expect_eq "no sd node is mapped twice" "$(printf '%s\n' "${sd[@]}" | sort | uniq -d)" ""
lab_expect_eq "no sg node is mapped twice" "$(printf '%s\n' "${sg[@]}" | sort | uniq -d)" ""

bad=""
for ((n = 1; n <= LAB_NODES; n++)); do
  node=$(lab_node_name "$n")
  for ((i = 0; i < LAB_LUNS; i++)); do
    p=$node/$i
    [[ -n ${sd[$p]:-} ]] || { bad+=" $p:unmapped"; continue; }
    [[ -b ${sd[$p]} && -c ${sg[$p]} ]] || bad+=" $p:device-nodes-missing"
    serial=$(sg_vpd --page=sn "${sg[$p]}" 2>/dev/null | sed -n 's/.*serial number: *//p')
    [[ $serial == "$(lab_lu_serial "$i")" ]] || bad+=" $p:serial=$serial"
    [[ ${wwn[$p]} == "${wwn[A/$i]}" ]] || bad+=" $p:wwn-differs-from-A"
  done
done
lab_expect_eq "every node reaches every LU with the configured serial" "$bad" ""
lab_expect_eq "LUs have distinct WWNs" "$(for ((i = 0; i < LAB_LUNS; i++)); do echo "${wwn[A/$i]}"; done | sort | uniq -d)" ""
last=$((LAB_LUNS - 1))
lab_expect_eq "LU $last's WWN is LIO's NAA form of its serial" "${wwn[B/$last]:-}" \
  "naa.6001405$(lab_lu_serial "$last" | cut -c1-25)"
lab_expect_eq "the JSON map lists the same paths" \
  "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["paths"]))' "$BLKFENCE_LAB_MAP_JSON")" "$paths"
lab_done

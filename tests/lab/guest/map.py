#!/usr/bin/python3
"""Writes the lab's node -> LU -> device map from sysfs, as TSV and JSON.

Reads "NODE HOST" lines on stdin (the SCSI host through which each node reaches the LUs) and lists,
for each SCSI device on that host, its LU number, WWN (sysfs wwid, from VPD 0x83), unit serial (VPD
0x80), sd and sg nodes and H:C:T:L. One Python process instead of a shell loop: under TCG every
process start costs about 0.2 s, and a 64-path map would take half a minute.

usage: map.py FABRIC MAP.tsv MAP.json < node-hosts
"""
import glob
import json
import os
import sys


def read_serial(device):
    # VPD 0x80: byte 3 is the page length, the serial follows the 4-byte header (SPC-4 7.8.15).
    with open(os.path.join(device, "vpd_pg80"), "rb") as f:
        page = f.read()
    length = page[3] if len(page) >= 4 else 0
    return page[4:4 + length].decode("ascii", "replace").strip()


def main():
    fabric, tsv_path, json_path = sys.argv[1:4]
    paths = []
    for line in sys.stdin:
        node, host = line.split()
        for hctl_dir in glob.glob(f"/sys/class/scsi_device/{host}:*"):
            hctl = os.path.basename(hctl_dir)
            device = os.path.join(hctl_dir, "device")
            with open(os.path.join(device, "wwid")) as f:
                wwn = f.read().strip("\0\n ")
            paths.append({
                "node": node,
                "lu": int(hctl.split(":")[3]),
                "wwn": wwn,
                "serial": read_serial(device),
                "sd": "/dev/" + os.listdir(os.path.join(device, "block"))[0],
                "sg": "/dev/" + os.listdir(os.path.join(device, "scsi_generic"))[0],
                "hctl": hctl,
            })
    paths.sort(key=lambda p: (p["node"], p["lu"]))
    columns = ["node", "lu", "wwn", "serial", "sd", "sg", "hctl"]
    with open(tsv_path, "w") as f:
        f.write("\t".join(columns) + "\n")
        for p in paths:
            f.write("\t".join(str(p[c]) for c in columns) + "\n")
    with open(json_path, "w") as f:
        json.dump({"fabric": fabric, "paths": paths}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()

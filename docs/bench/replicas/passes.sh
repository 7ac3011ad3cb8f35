#!/usr/bin/env bash
# The runs behind docs/deploy.md's tok/s table: two passes of plain (`--cascade none`), alone
# (`lookup,suffix`, no --share) and shared (`lookup,suffix`, --share) on the extract workload and
# on its first 12 requests each asked twice in a row, through examples/replicas/run.sh (two
# replicas behind nginx, one client, 24 requests). Run from the repository root.
set -euo pipefail
out=${1:-docs/bench/replicas}
repeated=$(mktemp --suffix=.jsonl)
python3 - "$repeated" <<'PY'
import json, sys
lines = [json.loads(l) for l in open("../shared/workloads/extract.jsonl")][:12]
with open(sys.argv[1], "w") as f:
    for request in lines:
        f.write(json.dumps(request) + "\n")
        f.write(json.dumps(dict(request, id=request["id"] + "-again")) + "\n")
PY
for pass in 1 2; do
    for workload in extract:../shared/workloads/extract.jsonl "repeated:$repeated"; do
        name=${workload%%:*}
        file=${workload#*:}
        for mode in plain alone shared; do
            flags=()
            cascade=lookup,suffix
            [[ $mode != shared ]] && flags=(--no-share)
            [[ $mode == plain ]] && cascade=none
            examples/replicas/run.sh "${flags[@]}" --clients 1 --requests 24 --workload "$file" \
                --out "$out/$mode-$name-$pass" -- --cascade "$cascade"
        done
    done
done
